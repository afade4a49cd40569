"""Running: what turns a composed config into a finished run folder and a sweep into many: composing a config
(``compose.py``), instantiating its ``_target_`` nodes (``targets.py``), assembling and simulating a run
(``assemble.py``), settings that change nothing (``no_effect.py``), writing and resuming a run folder
(``execute.py``), loading a finished one (``results.py``); kvstudy/api.py re-exports them. Also paths, atomic writes,
outputs (``summary.json`` written last), provenance and resume, the context a policy prepares with
(``run_context.py``), kvstudy's sweep launcher and its end-of-sweep callback."""
