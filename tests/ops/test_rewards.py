"""Rule-based rewards: answer extraction, numeric equivalence, format and countdown scores."""

import json

import pytest

from ops.rewards import (
    REWARD_FNS,
    accuracy_reward,
    answers_match,
    countdown_reward,
    evaluate_equation,
    extract_boxed_answer,
    extract_ground_truth,
    extract_gsm8k_answer,
    extract_math_answer,
    format_reward,
    math_boxed_reward,
    math_reward,
    parse_number,
)

GSM8K_TRUTH = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 1,072"


def test_reward_names_used_by_configs():
    for name in ("math_reward", "math_boxed_reward", "countdown_reward", "format_reward"):
        assert name in REWARD_FNS


def test_gsm8k_and_boxed_extraction():
    assert extract_gsm8k_answer(GSM8K_TRUTH) == "1072"
    assert extract_gsm8k_answer("#### -3.5") == "-3.5"
    assert extract_gsm8k_answer("#### $1,000") == "1000"
    assert extract_gsm8k_answer("no marker 5") is None
    assert extract_boxed_answer(r"so \boxed{\frac{1}{2}} and then \boxed{3}") == "3"
    assert extract_boxed_answer(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert extract_boxed_answer(r"\fbox{7}") == "7"
    assert extract_boxed_answer(r"$\boxed 42$") == "42"
    assert extract_boxed_answer(r"\boxed{unbalanced") is None
    assert extract_boxed_answer("nothing") is None
    assert extract_ground_truth(GSM8K_TRUTH) == "1072"
    assert extract_ground_truth(r"The answer is \boxed{12}") == "12"
    assert extract_ground_truth(" 12 ") == "12"


def test_final_answer_extraction_order():
    assert extract_math_answer("<think>2+2=4, maybe 5</think><answer>4</answer>") == "4"
    assert extract_math_answer(r"<answer>so \boxed{9}</answer>") == "9"
    assert extract_math_answer("blah 3 then 17.") == "17"
    assert extract_math_answer("total is 1,234 apples") == "1,234"
    assert extract_math_answer("<answer>x+1</answer>") == "x+1"
    assert extract_math_answer("no numbers") is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1,000", 1000.0),
        ("-3.5", -3.5),
        ("$12", 12.0),
        ("50%", 0.5),
        ("3/4", 0.75),
        (r"\frac{3}{4}", 0.75),
        (r"\dfrac{1}{8}", 0.125),
        ("x = 5", 5.0),
        (r"10\text{ dollars}", None),
        ("7.", 7.0),
        ("1/0", None),
        ("abc", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == (pytest.approx(value) if value is not None else None)


def test_answers_match_numeric_and_string():
    assert answers_match("18", "18.0")
    assert answers_match("1,072", "1072")
    assert answers_match(r"\frac{1}{2}", "0.5")
    assert answers_match("0.3333333", "1/3", rel_tol=1e-6)
    assert not answers_match("18", "19")
    assert answers_match(r"\text{(B)}", "(b)")
    assert not answers_match("x+1", "1+x")  # no symbolic algebra
    assert not answers_match(None, "1")
    assert not answers_match("", "")


def test_math_reward_gsm8k():
    good = "<think>48/2 = 24, 48 + 24 = 72</think>\n<answer>72</answer>"
    assert math_reward(good, "... #### 72") == {"accuracy": 1.0, "format_score": 0.1}
    assert math_reward("The answer is 72", "#### 72") == {"accuracy": 1.0, "format_score": -0.1}
    assert math_reward("<think>x</think><answer>71</answer>", "#### 72") == {
        "accuracy": 0.0,
        "format_score": 0.1,
    }
    assert math_reward("anything", None)["accuracy"] == 0.0
    assert accuracy_reward(r"thus \boxed{1,072}", GSM8K_TRUTH) == {"accuracy": 1.0}


def test_math_boxed_reward():
    assert math_boxed_reward(r"so \boxed{\frac{1}{2}}", r"\boxed{0.5}") == {
        "accuracy": 1.0,
        "format_score": 0.0,
    }
    assert math_boxed_reward("0.5 without a box", "0.5")["accuracy"] == 0.0
    no_think = math_boxed_reward(r"\boxed{2}", "2", with_think=True, format_score_coef=0.2)
    assert no_think == {"accuracy": 1.0, "format_score": -0.2}
    with_think = math_boxed_reward(r"<think>a</think> \boxed{2}", "2", with_think=True)
    assert with_think["format_score"] == 0.0


def test_format_reward():
    assert format_reward("<think>\nok\n</think>\n<answer>\n1\n</answer>") == {"format_score": 0.1}
    assert format_reward("<think>ok</think><answer>1</answer>") == {"format_score": -0.1}
    assert format_reward("ANSWER: 1", pattern=r"^ANSWER: \d+$") == {"format_score": 0.1}


def test_countdown_reward():
    truth = {"target": 24, "numbers": [4, 6, 1]}
    assert countdown_reward("<answer>4 * 6 * 1</answer>", truth) == {"score": 1.0}
    assert countdown_reward("<answer>(6 - 1) * 4</answer>", json.dumps(truth)) == {"score": 0.1}
    assert countdown_reward("<answer>4 * 6</answer>", truth) == {"score": 0.1}  # 1 unused
    assert countdown_reward("<answer>4 * 6 * 1 * 1</answer>", truth) == {"score": 0.1}
    assert countdown_reward("4 * 6 * 1", truth) == {"score": 0.0}  # no answer tag
    assert countdown_reward("<answer>4 / (1 - 1) * 6</answer>", truth) == {"score": 0.1}
    # no digits: not the given numbers, so only the format score (and nothing is executed)
    assert countdown_reward("<answer>__import__('os')</answer>", truth) == {"score": 0.1}


def test_evaluate_equation_is_safe_arithmetic():
    assert evaluate_equation("(1 + 2) * 3 - 4 / 2") == pytest.approx(7.0)
    assert evaluate_equation("-3 + 5") == 2.0
    assert evaluate_equation("2 ** 10") is None  # power is not a countdown operation
    assert evaluate_equation("1 / 0") is None
    assert evaluate_equation("open('x')") is None
    assert evaluate_equation("((1)") is None


def test_math_dapo_reward_by_the_papers_overlong_shaping():
    """DAPO (arXiv 2503.14476) eq. 13 with L_max = 20, L_cache = 4, factor 1: no penalty up to
    16 tokens, (16 - L) / 4 between, -1 past 20. Accuracy from the last box after </think>."""
    from ops.rewards import math_dapo_reward

    args = dict(enable_overlong_penalty=True, penalty_factor=1.0, max_response_length=20, cache_length=4)
    right = "<think>maybe \\boxed{4}</think> so \\boxed{5}"
    for length, penalty in [(10, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (20, -1.0), (21, -1.0)]:
        assert math_dapo_reward(right, "5", response_length=length, **args) == {
            "accuracy": 1.0, "format_score": pytest.approx(penalty)}
    assert math_dapo_reward("<think>\\boxed{5}</think> \\boxed{4}", "#### 5", response_length=3)["accuracy"] == 0.0
    assert math_dapo_reward("the answer is 5", "5", response_length=99) == {"accuracy": 0.0, "format_score": 0.0}
    assert math_dapo_reward("5", "\\boxed{5}", response_length=99)["accuracy"] == 1.0  # no box: the whole text
    with pytest.raises(ValueError, match="cache_length"):
        math_dapo_reward("x", "5", response_length=3, **{**args, "cache_length": 20})
    with pytest.raises(ValueError, match="needs penalty_factor"):
        math_dapo_reward("x", "5", response_length=3, enable_overlong_penalty=True)


def test_rlcr_reward_pays_for_being_right_and_for_being_calibrated():
    """By hand, upstream's default weights (0.5 format, 0.5 accuracy, 0.5 Brier): right at
    q = 0.8 earns 0.5 + 0.5 + 0.5 (1 - 0.2^2) = 1.48; wrong at 0.8 earns 0.5 + 0 + 0.5 (1 - 0.8^2)
    = 0.68, wrong at 0.1 earns 0.5 + 0.5 (1 - 0.01) = 0.995: owning up to a doubt pays."""
    from ops.rewards import rlcr_reward

    def reply(answer: str, q: str, tail: str = "") -> str:
        return f"<think>2 + 3</think>\n<answer>{answer}</answer> <analysis>checked</analysis><confidence>{q}</confidence>{tail}"

    total = lambda r: sum(v for k, v in r.items() if k in ("format", "accuracy", "brier"))  # noqa: E731
    assert total(rlcr_reward(reply("5", "0.8"), "#### 5")) == pytest.approx(1.48)
    assert total(rlcr_reward(reply("\\boxed{5}", "0.8"), "5")) == pytest.approx(1.48)
    assert total(rlcr_reward(reply("6", "0.8"), "5")) == pytest.approx(0.68)
    assert total(rlcr_reward(reply("6", "0.1"), "5")) == pytest.approx(0.995)
    r = rlcr_reward(reply("5", "1"), "5")
    assert r["mean_confidence"] == pytest.approx(1e-5) and r["confidence_one_or_zero"] == pytest.approx(1e-5)
    # the format: the four tags last, in order, only whitespace between and after, q in [0, 1]
    for broken in (reply("5", "0.8", " thanks"), reply("5", "1.5"), reply("5", "nan"),
                   "<answer>5</answer><confidence>0.8</confidence>",
                   "<think><answer>5</answer></think><answer>5</answer><analysis>a</analysis><confidence>0.8</confidence>"):
        r = rlcr_reward(broken, "5")
        assert (r["format"], r["accuracy"], r["brier"]) == (0.0, 0.0, 0.0), broken
    assert rlcr_reward("<answer>5</answer><confidence>0.3</confidence>", "5")["mean_confidence"] == pytest.approx(3e-6)
    weights = {"format": 0.0, "accuracy": 1.0, "brier": 1.0, "mean_confidence": 0.0, "confidence_one_or_zero": 0.0}
    assert rlcr_reward(reply("5", "0.5"), "5", weights=weights) == pytest.approx(
        {"format": 0.0, "accuracy": 1.0, "brier": 0.75, "mean_confidence": 0.0, "confidence_one_or_zero": 0.0})
    with pytest.raises(ValueError, match=r"missing \['confidence_one_or_zero'\], unknown \['calibration'\]"):
        rlcr_reward("x", "5", weights={**{k: 1.0 for k in weights if k != "confidence_one_or_zero"}, "calibration": 1.0})


def test_rm_gallery_math_verify_reward_scores_the_final_answer_against_the_reference():
    """Upstream's grpo_math example: rm_gallery_reward with RM-Gallery's math_verify_reward,
    one score named math_verify (its reward's name), 1.0 right, 0.0 wrong or unparsed."""
    from ops.rewards import rm_gallery_reward

    name = "math_verify_reward"
    assert rm_gallery_reward("so x = \\boxed{\\frac{1}{2}}", "0.5", reward_name=name) == {"math_verify": 1.0}
    assert rm_gallery_reward("it is 12", "12", reward_name=name) == {"math_verify": 1.0}
    assert rm_gallery_reward("it is 12", "13", reward_name=name) == {"math_verify": 0.0}
    assert rm_gallery_reward("no idea", "13", reward_name=name) == {"math_verify": 0.0}
    assert rm_gallery_reward("12", None, reward_name=name) == {"math_verify": 0.0}


def test_reward_options_are_checked_by_name_need_and_declared_values():
    """A taskset's reward_fn_args against the function: a typo, a missing required option and
    a value outside its Literal each give one line naming the option."""
    from ops.rewards import check_reward_options, math_dapo_reward, math_reward, rm_gallery_reward

    assert check_reward_options(math_reward, {}) == []
    assert check_reward_options(math_dapo_reward, {"enable_overlong_penalty": True, "penalty_factor": 1.0}) == []
    assert check_reward_options(math_reward, {"patern": "x"}) == [
        "patern: math_reward takes no such option (its options: pattern)"]
    assert check_reward_options(rm_gallery_reward, {}) == ["reward_name: rm_gallery_reward needs it"]
    assert check_reward_options(rm_gallery_reward, {"reward_name": "helpfulness"}) == [
        "reward_name: 'helpfulness' is not one of 'math_verify_reward' (rm_gallery_reward)"]
    assert check_reward_options(rm_gallery_reward, {"reward_name": "math_verify_reward"}) == []
    assert check_reward_options(lambda response, truth, **kw: {}, {"anything": 1}) == []
