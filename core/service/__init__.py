"""The modelsec gRPC service (`modelsec serve`) and its typed client.

Server side (needs the `grpc` extra): `load_server_config` reads the `ServerConfig` file,
`start_server`/`run_server` run the modelsec.v1 services (signing with server-held keys, verification,
the attestation store, watermark and robustness gate on server paths) with TLS/mTLS or bearer tokens,
health checking, reflection and Prometheus metrics. Client side: `ModelsecClient` (`modelsec.service.client`).
Nothing in modelsec imports this package except the CLI.

The public names live in the submodules (`modelsec.service.client`, `.config`, `.server`); the package
re-exports nothing, so importing the client does not load grpc's server side.
"""

__all__: list[str] = []
