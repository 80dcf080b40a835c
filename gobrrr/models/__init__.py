"""The reference model: gpt.py (a GPT-2-shaped decoder that knows nothing of parallelism) and
gpt_plan.py (its tensor-parallel plan, which `gobrrr.parallel.tp` applies). Open gpt.py first."""
