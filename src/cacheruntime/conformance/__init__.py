"""The conformance suite: hold any runtime to the reference model, call by call.

Engine teams point it at a factory (`cacheruntime conformance --runtime MODULE:FACTORY`,
or the pytest option `--cacheruntime-factory`) and get, on failure, a minimal call
sequence that shows where their runtime breaks the contract.
"""
