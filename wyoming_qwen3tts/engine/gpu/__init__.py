"""GPU policy: the CUDA environment (``cuda_env``), telling and naming out-of-memory errors
(``memory``), sizing the KV cache and the models' residency (``sizing``), weight precision
(``precision``), and models that take turns on one GPU (``lease``, ``on_demand``)."""
