// Validate cert-manager and prometheus-operator documents against the schemas of the npm packages
// @kubernetes-models/cert-manager and @kubernetes-models/prometheus-operator (installed by `make` into
// .venv/k8s-models). Usage: node validate_crds.mjs NODE_MODULES < docs.json (a JSON array of documents).
// Prints a JSON array: one entry per document, null when valid, else the validation message.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.argv[2];
// Each package ships ES modules, as index.mjs (cert-manager) or index.js (prometheus-operator).
const load = (p) => {
  const dir = join(modules, "@kubernetes-models", p);
  const file = existsSync(join(dir, "index.mjs")) ? join(dir, "index.mjs") : join(dir, "index.js");
  return import(pathToFileURL(file).href);
};
const groups = {
  "cert-manager.io/v1": await load("cert-manager/cert-manager.io/v1"),
  "monitoring.coreos.com/v1": await load("prometheus-operator/monitoring.coreos.com/v1"),
};
const docs = JSON.parse(readFileSync(0, "utf8"));
const results = docs.map((doc) => {
  const Model = (groups[doc.apiVersion] || {})[doc.kind];
  if (typeof Model !== "function") return `no schema for ${doc.apiVersion} ${doc.kind}`;
  try {
    new Model(doc).validate();
    return null;
  } catch (e) {
    return String(e.message || e);
  }
});
process.stdout.write(JSON.stringify(results));
