"""The forward: what computes one packed step's logits, and the KV caches it runs over.

- ``packed_runner``: ``DecoderRunner``, one hand-written packed forward for the families
  in ``families`` (the fast path);
- ``module_runner``: ``ModuleRunner``, the generic path: any other decoder's own
  transformers modules over the same slot cache, checked exact at load or refused;
- ``families``: the decoder families the packed runner computes exactly, and the
  switches that tell them apart;
- ``linears``: the packed runner's projections (dense, int8, int4, integer dots);
- ``row_blocks``: how many rows one bf16 GEMM may take with every row as it is alone
  (32 on AMX CPUs), and the fixed call sizes a long prompt's rows take, probed per
  weight shape;
- ``norms``: RMSNorm with the fewest ops the machine allows;
- ``slot_attention``: attention over the slot cache for one packed step (both runners);
- ``decode_attention``: its decode kernels (sdpa, matmul, compiled), picked per machine;
- ``kv_cache``: ``SlotKVCache``, one preallocated slot per live sequence;
- ``prefix_cache``: ``PrefixCache``, the keys and values of shared prompt prefixes;
- ``step_threads``: ``StepThreads``, torch's intra-op thread count per step on CPU.

Owner: built on the load thread (``backends.hf.assemble``), then the engine thread's
alone; nothing here is thread-safe. The packed runner reads its quantization plan from
``loading.quantization`` and adds LoRA deltas from ``adapters.bank``.
"""
