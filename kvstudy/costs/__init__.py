"""Cost models beside the latency model (kvstudy/latency/): a model's architecture and KV bytes (``arch.py``), KV
capacity from GPU memory (``capacity.py``), the cost of moving KV to the host (``swap_models.py``) and of preempting by
swap or recompute (``preemption_cost.py``), and the output-length predictors policies see (``predictors.py``)."""
