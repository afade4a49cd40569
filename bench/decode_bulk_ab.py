"""Issue 59 item 4 (an experiment, reverted in the next commit): a decode run's stretches as a whole
(kvstudy/engine/decode_bulk.py) against one by one, best of ROUNDS interleaved runs in one process, the Vidur
comparison's aligned vLLM setting (bench/vs_vidur.py):  python bench/decode_bulk_ab.py splitwise_conv 10000 5"""
import sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import vs_vidur as V
from kvstudy import api
from kvstudy.engine.loop import StepEngine
from kvstudy.workloads.requests import make_requests
workload, n = sys.argv[1], int(sys.argv[2]); rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
arrival, prompt, output = V.requests(workload, n, 1)
ov = ["+policy=vllm", "engine.progress=false", f"memory.capacity_tokens={V.CAPACITY}", f"memory.block_size={V.BLOCK}",
      f"policy.max_num_batched_tokens={V.TOKENS_IN_BATCH}", "policy.running_order=arrival", f"policy.max_num_seqs={V.VIDUR_CAP}"]
cfg = api.compose(ov)
arch, hw, capacity, latency = api.model_setup(cfg)
latency = V.VidurKeys(latency)
req = make_requests(arrival, prompt, output, source=workload)
best = {True: 1e9, False: 1e9}
for r in range(rounds):
    for flag in (False, True):
        StepEngine.bulk_decode = flag
        policy = api.build_policy(cfg); policy.reset(0)
        eng = api.build_engine(cfg, req, req.output_tokens, policy, latency, arch, hw, capacity)
        t0 = time.perf_counter(); res = eng.run(); best[flag] = min(best[flag], time.perf_counter() - t0)
print(workload, n, "one-by-one", round(best[False], 3), "bulk", round(best[True], 3), "ratio", round(best[False]/best[True], 3))
