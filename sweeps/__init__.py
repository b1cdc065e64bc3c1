"""Hyper-parameter sweeps, for sweep.py only: the search space and its specs (space), the plan of
trials (plan), running them as train.py processes (runner), the ranked summary (results), SLURM
job arrays (slurm), Optuna's search (optuna_search) and stop signals outside a trial
(signals)."""
