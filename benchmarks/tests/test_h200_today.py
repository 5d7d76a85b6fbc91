import json
from pathlib import Path

from benchmarks.h200_today import FIRST_TOKEN_FIT_DIR, FIT_DIR, fit_for, fitted_profile


def test_each_kind_of_run_gets_the_fit_measured_as_it_was(tmp_path: Path) -> None:
    # The 2026-12-04 bring-up runs timed the first token with text (the unpadded dummy
    # tokenizer), as the sixth loan did: 33.34 ms (35.34 before the tokenizer's 2 ms wait was
    # taken out, refitted 2026-12-07) and 8.434 us a prompt token. The published
    # runs (real weights) take the first-token fit, made with the eager step's floor from the
    # ninth loan's step traces (26.3 ms), decode attention as vLLM's kernels ran it in the
    # seventh loan's decode traces (136 us + 1.065 x the operators') and the API server's 31.3
    # us a streamed token (the token arrivals of every loan's calibration cases, the loan's
    # own host unmeasured): 6.6 ms (less the tokenizer's 2 ms wait, which the simulated intake
    # adds itself since 2026-12-07) and 4.478 us.
    text = fit_for("llama-3.1-8b", FIT_DIR)
    first = fit_for("llama-3.1-8b", FIRST_TOKEN_FIT_DIR)
    assert text is not None and first is not None
    assert (text["request_overhead_ms"], text["intake_us_per_prompt_token"]) == (33.34, 8.434)
    assert (first["request_overhead_ms"], first["intake_us_per_prompt_token"]) == (6.6, 4.478)
    assert first["output_us_per_token"] == 31.3 and "output_us_per_token" not in text
    assert first["eager_step_ms"] == 26.3 and "eager_step_ms" not in text
    assert first["decode_attention_scale"] == 1.065 and "decode_attention_scale" not in text
    # A model no loan fitted gets none.
    assert fit_for("llama-3.1-70b", FIRST_TOKEN_FIT_DIR) is None
    path = fitted_profile("h200-llama-3.1-8b-fp8.json", tmp_path, FIRST_TOKEN_FIT_DIR)
    assert path is not None
    meta = json.loads(path.read_text())["meta"]
    assert meta["request_overhead_ms"] == 6.6 and meta["step_overhead_ms"] == 0.156
