"""Rule-based rewards used by the built-in workflows.

Each reward function is ``fn(response, truth, *, prompt=None, **options) -> dict[str, float]``:
a plain function of the model's text and the task's ground truth returning named scores
(the workflow sums them into the experience's reward and logs each one). Names follow
Trinity-RFT's ``default_reward_fn_type`` values and are looked up through ``REWARD_FNS``.

Answers are compared as numbers when both sides parse as numbers (``1,000`` = ``1000.0`` =
``\\frac{2000}{2}``), otherwise as normalised strings (spaces, ``$``, ``\\text{}``,
``\\left``/``\\right``, ``dfrac`` and a trailing period removed). No symbolic algebra: ``x+1``
and ``1+x`` are different answers.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import math
import operator
import re
from collections.abc import Callable
from typing import Any, Literal

from ops.registry import bad_values, parts, register

RewardFn = Callable[..., dict[str, float]]

# Name -> reward function (the registry's "reward_fn" map; add one with
# ``@register("reward_fn", name)``).
REWARD_FNS: dict[str, RewardFn] = parts("reward_fn")

# The data arguments a reward function may take (the rest are options): every one takes the
# first three; ``response_length`` (tokens) goes to those that name it (DAPO's overlong penalty).
REWARD_DATA: tuple[str, ...] = ("response", "truth", "prompt", "response_length")


def call_reward(fn: RewardFn, response: str, truth: Any, *, prompt: str | None = None,
                response_length: int | None = None, options: dict[str, Any] | None = None) -> dict[str, float]:
    """``fn``'s scores for one response, with the data arguments it takes."""
    extra = {"response_length": response_length} if _takes_length(fn) else {}
    return fn(response, truth, prompt=prompt, **extra, **(options or {}))


def _takes_length(fn: RewardFn) -> bool:
    """Whether ``fn`` takes ``response_length``: asked once per function (inspect.signature
    per response was a third of the quickstart explorer's reward time)."""
    try:
        return _takes_length_cached(fn)
    except TypeError:  # an unhashable callable: ask each time
        return "response_length" in inspect.signature(fn).parameters


@functools.lru_cache(maxsize=256)
def _takes_length_cached(fn: RewardFn) -> bool:
    return "response_length" in inspect.signature(fn).parameters


def check_reward_options(fn: RewardFn, options: dict[str, Any]) -> list[str]:
    """What is wrong with ``options`` (a taskset's ``reward_fn_args``) for ``fn``, one line per
    option: a name ``fn`` does not take, a setting it needs that is missing, a value its
    signature rules out (:func:`ops.registry.bad_values`). Checked before start, so a typo does not fail every task."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    options_of = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY and n not in REWARD_DATA]
    out = [f"{k}: {fn.__name__} takes no such option (its options: {', '.join(options_of) or 'none'})"
           for k in options if k not in options_of]
    out += [f"{n}: {fn.__name__} needs it" for n in options_of
            if params[n].default is inspect.Parameter.empty and n not in options]
    return out + [f"{line} ({fn.__name__})" for line in bad_values(fn, {k: v for k, v in options.items() if k in options_of})]

THINK_ANSWER_PATTERN = r".*?<think>.*?</think>\s*<answer>.*?</answer>\s*$"
STRICT_FORMAT_PATTERN = r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"

# ------------------------------------------------------------------- extraction

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_GSM8K = re.compile(r"####\s*([-+]?\$?\s*[\d.,]*\d)")
_NUMBER = re.compile(r"[-+]?(?:\d(?:[\d,]*\d)?(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+(?:\.\d+)?)?")


def extract_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>``, stripped; ``None`` if there is none."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def extract_gsm8k_answer(text: str) -> str | None:
    """The number after GSM8K's final ``#### `` marker (commas and ``$`` removed)."""
    found = _GSM8K.findall(text)
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "").replace(" ", "")


def extract_boxed_answer(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``), braces balanced."""
    starts = [m.start() for m in re.finditer(r"\\(?:boxed|fbox)", text)]
    if not starts:
        return None
    start = starts[-1]
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":  # "\boxed 5": up to the next space or '$'
        m = re.match(r"[^\s$]+", text[i:])
        return m.group(0) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None  # unbalanced braces: no answer


def extract_last_number(text: str) -> str | None:
    """The last number (integer, decimal, ``a/b``) in ``text``."""
    found = _NUMBER.findall(text)
    return found[-1].strip() if found else None


def extract_math_answer(text: str) -> str | None:
    """The model's final answer: inside the last ``<answer>`` tag if any (else the whole text),
    the last ``\\boxed{}``, else a GSM8K ``#### n``, else the tag's content, else the last
    number.
    """
    tag = extract_answer_tag(text)
    region = text if tag is None else tag
    for extract in (extract_boxed_answer, extract_gsm8k_answer):
        found = extract(region)
        if found is not None:
            return found
    if tag is not None and tag:
        return tag
    return extract_last_number(region)


def extract_ground_truth(truth: str) -> str:
    """A dataset's answer field: GSM8K's ``... #### 72`` -> ``72``; ``\\boxed{x}`` -> ``x``."""
    for extract in (extract_gsm8k_answer, extract_boxed_answer):
        found = extract(truth)
        if found is not None:
            return found
    return truth.strip()


# ------------------------------------------------------------------- comparison

_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_FRAC = re.compile(r"^\\frac\{([^{}]+)\}\{([^{}]+)\}$")


def normalize_answer(answer: str) -> str:
    """Canonical string form of an answer (see module docstring)."""
    s = answer.strip()
    s = _TEXT_WRAPPERS.sub(r"\1", s)
    for old, new in (
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\ ", ""),
        ("\\$", ""),
        ("$", ""),
        ("\\%", "%"),
        ("^\\circ", ""),
        ("^{\\circ}", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
    ):
        s = s.replace(old, new)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^[a-zA-Z]\s*=", "", s)  # "x=5" -> "5"
    s = s.rstrip(".")
    return s.lower()


def parse_number(answer: str) -> float | None:
    """``answer`` as a float (``1,000``, ``-3.5``, ``50%``, ``3/4``, ``\\frac{3}{4}``), else None."""
    s = normalize_answer(answer)
    percent = s.endswith("%")
    s = s.rstrip("%")
    if re.fullmatch(r"[-+]?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    frac = _FRAC.match(s)
    if frac:
        s = f"{frac.group(1)}/{frac.group(2)}"
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            value = float(num) / float(den)
        else:
            value = float(s)
    except (ValueError, ZeroDivisionError):
        return None
    if not math.isfinite(value):
        return None
    return value / 100.0 if percent else value


def answers_match(prediction: str | None, truth: str | None, rel_tol: float = 1e-6) -> bool:
    """True when both parse as numbers within ``rel_tol`` (or 1e-9 absolute), or normalise to
    the same string."""
    if prediction is None or truth is None:
        return False
    a, b = parse_number(prediction), parse_number(truth)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9)
    return normalize_answer(prediction) == normalize_answer(truth) != ""


def has_think_pattern(text: str) -> bool:
    """Exactly one ``<think>`` and one ``</think>``, in that order."""
    if text.count("<think>") != 1 or text.count("</think>") != 1:
        return False
    return text.index("<think>") < text.index("</think>")


# ------------------------------------------------------------------- rewards


@register("reward_fn", "format_reward")
def format_reward(
    response: str,
    truth: Any = None,
    *,
    prompt: str | None = None,
    pattern: str = STRICT_FORMAT_PATTERN,
) -> dict[str, float]:
    """``format_score`` 0.1 if ``response`` matches the regex ``pattern``, else -0.1.

    The default is open-r1's strict layout: ``<think>``, reasoning, ``</think>``, ``<answer>``,
    answer, ``</answer>``, each on its own line.
    """
    ok = re.match(pattern, response, re.DOTALL | re.MULTILINE) is not None
    return {"format_score": 0.1 if ok else -0.1}


@register("reward_fn", "accuracy_reward")
def accuracy_reward(
    response: str, truth: Any = None, *, prompt: str | None = None
) -> dict[str, float]:
    """``accuracy`` 1.0 if the final answer (``extract_math_answer``) matches the truth."""
    if truth is None:
        return {"accuracy": 0.0}
    ok = answers_match(extract_math_answer(response), extract_ground_truth(str(truth)))
    return {"accuracy": 1.0 if ok else 0.0}


@register("reward_fn", "math_reward")
def math_reward(
    response: str,
    truth: Any = None,
    *,
    prompt: str | None = None,
    pattern: str = THINK_ANSWER_PATTERN,
) -> dict[str, float]:
    """GSM8K-style math reward (Trinity-RFT's ``math_workflow`` default).

    ``accuracy``: 1.0 if the final answer equals the truth (GSM8K ``#### n``, ``\\boxed{}`` or
    plain). ``format_score``: +0.1 if the response is ``<think>..</think> <answer>..</answer>``,
    else -0.1.
    """
    scores = accuracy_reward(response, truth)
    scores.update(format_reward(response, pattern=pattern))
    return scores


@register("reward_fn", "math_boxed_reward")
def math_boxed_reward(
    response: str,
    truth: Any = None,
    *,
    prompt: str | None = None,
    with_think: bool = False,
    format_score_coef: float = 0.1,
) -> dict[str, float]:
    """Math reward for ``\\boxed{}`` answers (MATH-style prompts).

    ``accuracy``: 1.0 if the last ``\\boxed{}`` in the response matches the truth (whose own
    ``\\boxed{}`` is unwrapped if present). ``format_score``: ``-format_score_coef`` when
    ``with_think`` and the response lacks one ``<think>...</think>``, else 0.
    """
    predicted = extract_boxed_answer(response)
    ok = truth is not None and answers_match(predicted, extract_ground_truth(str(truth)))
    format_score = 0.0
    if with_think and not has_think_pattern(response):
        format_score = -format_score_coef
    return {"accuracy": 1.0 if ok else 0.0, "format_score": format_score}


@register("reward_fn", "rm_gallery_reward")
def rm_gallery_reward(
    response: str,
    truth: Any = None,
    *,
    prompt: str | None = None,
    reward_name: Literal["math_verify_reward"],
    timeout_score: float = 0.0,
) -> dict[str, float]:
    """Trinity-RFT's ``rm_gallery_reward`` (``reward_fn_args.reward_name`` picks a reward of
    RM-Gallery's registry) for the one its examples name, RM-Gallery's rule-based
    ``math_verify_reward``: ``math_verify`` 1.0 when the response's final answer equals the
    reference (``format.response_key``), else 0.0. RM-Gallery parses both sides with the
    math-verify package and compares them symbolically; here they compare as every math reward
    here does (numbers, else normalised strings: the module's docstring), so ``x+1`` and
    ``1+x`` differ. ``timeout_score`` is kept for its configs (nothing here times out).
    RM-Gallery's reward models (LLM judges) are not here: use a judge workflow
    (``math_ruler_workflow``, ``rubric_judge_workflow``)."""
    return {"math_verify": accuracy_reward(response, truth)["accuracy"]}


@register("reward_fn", "math_dapo_reward")
def math_dapo_reward(
    response: str,
    truth: Any = None,
    *,
    prompt: str | None = None,
    response_length: int | None = None,
    enable_overlong_penalty: bool = False,
    penalty_factor: float | None = None,
    max_response_length: int | None = None,
    cache_length: int | None = None,
) -> dict[str, float]:
    """DAPO's math reward with its overlong reward shaping (arXiv 2503.14476, eq. 13), as
    Trinity-RFT scores it. ``accuracy``: 1.0 if the last ``\\boxed{}`` after any ``</think>``
    (else that whole text) matches the truth. ``format_score``: 0, or with
    ``enable_overlong_penalty`` the soft length penalty of a response of ``L`` tokens, with
    ``L_max = max_response_length`` and ``L_cache = cache_length``: 0 while
    ``L <= L_max - L_cache``, then ``(L_max - L_cache - L) / L_cache * penalty_factor``,
    ``-penalty_factor`` past ``L_max``."""
    answer_part = response.split("</think>")[-1]
    predicted = extract_boxed_answer(answer_part) or answer_part
    ok = truth is not None and answers_match(predicted, extract_ground_truth(str(truth)))
    return {"accuracy": 1.0 if ok else 0.0,
            "format_score": overlong_penalty(response_length, penalty_factor, max_response_length, cache_length)
            if enable_overlong_penalty else 0.0}


def overlong_penalty(length: int | None, penalty_factor: float | None, max_response_length: int | None,
                     cache_length: int | None) -> float:
    """DAPO's soft overlong punishment of a ``length``-token response (see :func:`math_dapo_reward`)."""
    if length is None or penalty_factor is None or max_response_length is None or cache_length is None:
        raise ValueError("math_dapo_reward: enable_overlong_penalty needs penalty_factor, max_response_length "
                         "and cache_length (reward_fn_args), and the response's length")
    if not 0 < cache_length < max_response_length:
        raise ValueError(f"math_dapo_reward: cache_length ({cache_length}) must be above 0 and below "
                         f"max_response_length ({max_response_length})")
    expected = max_response_length - cache_length
    if length <= expected:
        return 0.0
    if length > max_response_length:
        return -float(penalty_factor)
    return (expected - length) / cache_length * penalty_factor


# ------------------------------------------------------------------- RLCR

#: RLCR's reward parts and the weights Trinity-RFT's ``rlcr_reward`` defaults to (its example's).
RLCR_WEIGHTS: dict[str, float] = {"format": 0.5, "accuracy": 0.5, "brier": 0.5, "mean_confidence": 1e-5,
                                  "confidence_one_or_zero": 1e-5}
_RLCR_TAG = re.compile(r"</?(think|answer|analysis|confidence)>")
_RLCR_ORDER = [f"<{t}>" if i % 2 == 0 else f"</{t}>"
               for t in ("think", "answer", "analysis", "confidence") for i in range(2)]


def _unit_number(text: str) -> float | None:
    """``text`` as a finite number in [0, 1]; None when it is not one."""
    try:
        value = float(text.strip())
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def rlcr_ending(response: str) -> tuple[str, float] | None:
    """The answer and confidence of a response in RLCR's format, None when it is not: the reply
    ends with ``<think>..</think><answer>..</answer><analysis>..</analysis><confidence>q</confidence>``
    (only whitespace between those four and after the last), every one of the four tags in the
    whole reply is closed before the next opens, and ``q`` is a number in [0, 1]."""
    tags = list(_RLCR_TAG.finditer(response))
    inside = None
    for tag in tags:
        if tag.group(0).startswith("</"):
            if inside != tag.group(1):
                return None
            inside = None
        elif inside is not None:
            return None
        else:
            inside = tag.group(1)
    last = tags[-8:]
    if inside is not None or [t.group(0) for t in last] != _RLCR_ORDER:
        return None
    gaps = [response[last[i].end():last[i + 1].start()] for i in (1, 3, 5)] + [response[last[7].end():]]
    confidence = _unit_number(response[last[6].end():last[7].start()])
    if any(g.strip() for g in gaps) or confidence is None:
        return None
    return response[last[2].end():last[3].start()], confidence


def last_confidence(response: str) -> float | None:
    """The number in the reply's last ``<confidence>..</confidence>``, whatever the rest of its
    format: what RLCR's confidence statistics read."""
    start, end = response.rfind("<confidence>"), response.rfind("</confidence>")
    if start < 0 or end < start:
        return None
    payload = response[start + len("<confidence>"):end]
    return None if _RLCR_TAG.search(payload) else _unit_number(payload)


@register("reward_fn", "rlcr_reward")
def rlcr_reward(
    response: str,
    truth: Any = None,
    *,
    prompt: str | None = None,
    weights: dict[str, float] | None = None,
) -> dict[str, float]:
    """RLCR (Damani et al. 2025, "Beyond Binary Rewards", arXiv:2507.16806), as Trinity-RFT's
    main branch scores it: the model answers, then states its confidence ``q`` that the answer
    is right, and is paid for being right *and* for being calibrated.

    Parts, each already multiplied by its weight (``weights``: all five names, or none for
    :data:`RLCR_WEIGHTS`): ``format`` 1 when :func:`rlcr_ending` reads the reply; ``accuracy``
    1 when its answer matches the truth (``answers_match``; a ``\\boxed{}`` in it is unwrapped);
    ``brier`` ``1 - (accuracy - q)^2`` (the Brier score turned into a reward: a proper scoring
    rule, so stating the true chance of being right pays most); both 0 when the format fails.
    ``mean_confidence`` and ``confidence_one_or_zero`` (the last stated ``q``, and whether it is
    within 0.01 of 0 or 1) are statistics to watch, weighted near 0 by default. The workflow
    sums the parts into the reward; ``accuracy`` is the weighted one, as upstream logs it."""
    w = dict(RLCR_WEIGHTS) if weights is None else weights
    if set(w) != set(RLCR_WEIGHTS):
        raise ValueError(f"rlcr_reward: weights must name exactly {', '.join(RLCR_WEIGHTS)}; missing "
                         f"{sorted(set(RLCR_WEIGHTS) - set(w))}, unknown {sorted(set(w) - set(RLCR_WEIGHTS))}")
    bad = [k for k, v in w.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)]
    if bad:
        raise ValueError(f"rlcr_reward: weights {bad} must be finite numbers")
    stated = last_confidence(response)
    ending = rlcr_ending(response)
    right = brier = 0.0
    if ending is not None and truth is not None:
        answer, q = ending
        right = float(answers_match(extract_boxed_answer(answer) or answer.strip(), extract_ground_truth(str(truth))))
        brier = 1.0 - (right - q) ** 2
    parts = {"format": float(ending is not None), "accuracy": right, "brier": brier,
             "mean_confidence": stated if stated is not None else 0.0,
             "confidence_one_or_zero": float(stated is not None and (stated < 0.01 or stated > 0.99))}
    return {k: float(w[k]) * v for k, v in parts.items()}


# ------------------------------------------------------------------- countdown

_BINARY_OPS: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _eval_arithmetic(node: ast.AST) -> float:
    """Evaluate +, -, *, / over number literals; anything else raises ``ValueError``."""
    if isinstance(node, ast.Expression):
        return _eval_arithmetic(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _eval_arithmetic(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        return _BINARY_OPS[type(node.op)](_eval_arithmetic(node.left), _eval_arithmetic(node.right))
    raise ValueError(f"not plain arithmetic: {ast.dump(node)}")


def evaluate_equation(equation: str) -> float | None:
    """Value of an arithmetic expression (digits, ``+ - * /``, parentheses), else None.

    Parsed with ``ast`` and walked by hand: no ``eval`` of model output.
    """
    if not re.fullmatch(r"[\d+\-*/().\s]+", equation):
        return None
    try:
        return _eval_arithmetic(ast.parse(equation, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


@register("reward_fn", "countdown_reward")
def countdown_reward(
    response: str,
    truth: Any = None,
    *,
    prompt: str | None = None,
    format_score: float = 0.1,
) -> dict[str, float]:
    """Countdown (TinyZero): combine ``numbers`` with + - * / to reach ``target``.

    ``truth`` is ``{"target": int, "numbers": [int, ...]}`` (or that as JSON). ``score``: 1.0
    for a correct equation in the last ``<answer>`` tag using each number exactly once,
    ``format_score`` for an answer that is wrong or uses other numbers, 0 with no answer.
    """
    if truth is None:
        return {"score": 0.0}
    spec = json.loads(truth) if isinstance(truth, str) else truth
    target, numbers = spec["target"], spec["numbers"]
    equation = extract_answer_tag(response)
    if equation is None:
        return {"score": 0.0}
    used = sorted(int(n) for n in re.findall(r"\d+", equation))
    if used != sorted(int(n) for n in numbers):
        return {"score": format_score}
    value = evaluate_equation(equation)
    if value is None or abs(value - float(target)) >= 1e-5:
        return {"score": format_score}
    return {"score": 1.0}
