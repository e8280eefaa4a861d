// A second implementation verifies modelsec's bundles: sigstore-js (@sigstore/bundle, @sigstore/verify).
//
// Usage: node sigstore_js_verify.js MODULES_DIR BUNDLE_JSON PUBLIC_KEY_PEM SUBJECT_SHA256_HEX
//
// The bundle is parsed and validated as a v0.3 bundle (assertBundleLatest), its key is looked up by its
// hint in trust material holding only the given public key (toTrustMaterial), and it is verified with the
// transparency-log, CT-log and timestamp thresholds at 0: nothing here reaches a TUF root, and the bundles
// carry a public-key hint, not a Fulcio certificate. For a DSSE bundle the in-toto statement must then
// name SUBJECT_SHA256_HEX among its subjects (cosign verify-attestation checks the image digest the same
// way); a message-signature bundle must sign exactly that digest. Prints one JSON line; exit 0 only when
// everything holds.
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const path = require("path");

const [modules, bundlePath, keyPath, subject] = process.argv.slice(2);
const { bundleFromJSON, assertBundleLatest } = require(path.join(modules, "@sigstore/bundle"));
const { Verifier, toSignedEntity, toTrustMaterial } = require(path.join(modules, "@sigstore/verify"));

function main() {
  const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(bundlePath, "utf8")));
  assertBundleLatest(bundle);
  const pem = fs.readFileSync(keyPath);
  const hint = crypto.createHash("sha256").update(pem).digest("hex");
  const der = crypto.createPublicKey(pem).export({ type: "spki", format: "der" });
  const root = {
    mediaType: "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
    tlogs: [],
    certificateAuthorities: [],
    ctlogs: [],
    timestampAuthorities: [],
  };
  const trust = toTrustMaterial(root, { [hint]: { rawBytes: der, keyDetails: 5 } });
  const verifier = new Verifier(trust, {
    tlogThreshold: 0,
    ctlogThreshold: 0,
    tsaThreshold: 0,
    timestampThreshold: 0,
  });
  const artifact = Buffer.from(subject, "hex");
  verifier.verify(toSignedEntity(bundle, artifact));
  const out = { ok: true, hint: bundle.verificationMaterial.content.publicKey.hint };
  if (bundle.content.$case === "dsseEnvelope") {
    const envelope = bundle.content.dsseEnvelope;
    if (envelope.payloadType !== "application/vnd.in-toto+json") {
      throw new Error(`payloadType ${envelope.payloadType}`);
    }
    const statement = JSON.parse(Buffer.from(envelope.payload).toString("utf8"));
    const digests = statement.subject.map((s) => (s.digest || {}).sha256);
    if (!digests.includes(subject)) {
      throw new Error(`statement is about ${digests.join(", ")}, not ${subject}`);
    }
    out.predicateType = statement.predicateType;
    out.predicate = statement.predicate;
  } else {
    const digest = Buffer.from(bundle.content.messageSignature.messageDigest.digest).toString("hex");
    if (digest !== subject) {
      throw new Error(`message signature over ${digest}, not ${subject}`);
    }
  }
  return out;
}

try {
  process.stdout.write(JSON.stringify(main()) + "\n");
} catch (e) {
  process.stdout.write(JSON.stringify({ ok: false, error: `${e.name}: ${e.message}` }) + "\n");
  process.exit(1);
}
