"""The runtime guard's framework modules: one per framework whose entry points the guard redirects.

Each module exports `PATCHERS`, a mapping from the name of the framework module that defines an entry point to
the function that patches it (`modelsec.verifier.guard.patching.Patcher`), built on the shared core in
`modelsec.verifier.guard.patching`. `modelsec.verifier.guard.hook` lists every module's `PATCHERS` in one
table and registers them with the post-import hooks when the guard is installed: nothing here imports a
framework.
"""
