"""`servepilot tune`: an SLA-driven search over vLLM's knobs, one knob at a time.

    sla.py        the SLA (`--slo`), whether a bench level meets it, which SLO binds
    space.py      a trial's configuration, the knobs' value ladders, the canonical key
    planspace.py  the search space the planner allows, its fit check, a trial's fleet config
    score.py      a finished trial: goodput at the SLA, seed 004's diagnostic signals
    moves.py      one-knob moves, and the max_num_seqs moves a sweep shows change nothing
    policy.py     the search: a pure function of (space, history) -> next trial or stop
    loadsweep.py  the load sweep of one trial (bench's sweep, then a bisection at the SLA)
    store.py      trials.jsonl: one line per finished trial, so a re-run resumes
    search.py     the loop: policy -> trial runner -> store, with progress callbacks
    summary.py    every trial as a row, the best one, the gain over the default
    report_html.py  the self-contained HTML report

The trial runners, which launch and measure, live at the edge (servepilot/tune/runners/sim.py,
servepilot/tune/runners/vllm.py) behind `search.TrialRunner`'s one method.
"""
