"""Issue 29: the prompt cap counts tokens as the text encoder's tokenizer makes them, not characters.

The CLIP tokenizer is byte-level BPE: a character it has no merge for is one token per UTF-8 byte,
and a run of such characters is one piece whose merging cost grows with the square of its length.
2,500 CJK characters passed the 2,500-character cap and took 312 s to tokenize (2,500 emoji 194 s;
ASCII 37 s). Now ASCII counts 4 characters a token (the rule the character cap rests on) and any
other character one token per UTF-8 byte; the message says what was counted.
"""
from __future__ import annotations

import pytest

from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.worker.protocol import GenerateRequest, check_prompt, prompt_tokens
from accelstack.limits import MAX_PROMPT_CHARS, MAX_PROMPT_TOKENS

from engine_helpers import cli_env, run_cli


@pytest.mark.parametrize("text, per_char", [("猫" * 2500, 3), ("😀" * 2500, 4), ("é" * 2500, 2), ("猫😀" * 1250, 3.5)])
def test_non_ascii_prompts_within_the_character_cap_are_refused_by_tokens(text, per_char):
    assert len(text) <= MAX_PROMPT_CHARS
    with pytest.raises(InvalidRequestError) as err:
        GenerateRequest(prompt=text).validate()
    message = err.value.message
    assert f"counts {int(2500 * per_char)} tokens" in message and f"at most {MAX_PROMPT_TOKENS}" in message, message
    assert "UTF-8 byte" in message and "2500 other characters" in message, message  # what was counted
    assert "75-token chunks" in err.value.hint and "shorten the prompt" in err.value.hint
    assert len(str(err.value)) < 600
    with pytest.raises(InvalidRequestError, match="negative prompt counts"):
        GenerateRequest(prompt="a cat", negative_prompt=text).validate()


def test_the_budget_is_the_same_for_ascii_and_scales_by_bytes_elsewhere():
    assert prompt_tokens("p" * MAX_PROMPT_CHARS) == MAX_PROMPT_TOKENS  # ASCII: as before, 2,500 characters
    GenerateRequest(prompt="p" * MAX_PROMPT_CHARS).validate()
    most_cjk = MAX_PROMPT_TOKENS // 3
    assert check_prompt("猫" * most_cjk) == "猫" * most_cjk
    with pytest.raises(InvalidRequestError, match="tokens"):
        check_prompt("猫" * (most_cjk + 1))
    mixed = "a photo of a cat, " * 20 + "猫の写真" * 20  # 360 ASCII (90 tokens) + 80 CJK characters (240)
    assert prompt_tokens(mixed) == 90 + 240
    check_prompt(mixed)
    assert prompt_tokens("") == 0 and prompt_tokens("abc") == 1 and prompt_tokens("abcde") == 2


def test_generate_refuses_a_cjk_prompt_before_any_work(tmp_path):
    env = cli_env(tmp_path / "cache", tmp_path)
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"\xff" * 64)
    res = run_cli(["generate", "--runtime", tmp_path, "-m", model, "-p", "猫" * 2500, "-W", "64", "-H", "64",
                   "--steps", "1"], env, timeout=120)
    assert res.returncode == 2, (res.returncode, res.stderr[-1000:])
    assert "counts 7500 tokens" in res.stderr and "Traceback" not in res.stderr, res.stderr[-1000:]
    assert not (tmp_path / "home").exists()
