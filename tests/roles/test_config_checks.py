"""Config mistakes fail with exit 2, naming the field, before any process starts; secrets print
as ``***``. The value checks run ``trinity config``'s entry point in this process (one
subprocess each would take 2 s); the rest run ``trinity`` as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from roles.cli import main

ROOT = Path(__file__).resolve().parents[2]


def trinity(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRINITY_")}
    full_env.update(OMP_NUM_THREADS="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "roles.cli", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def config(tmp_path, monkeypatch, capsys):
    """``trinity config --set ...`` in this process: (exit code, stdout, stderr)."""
    for k in [k for k in os.environ if k.startswith("TRINITY_")]:
        monkeypatch.delenv(k)

    def run(*sets: str, extra: tuple[str, ...] = ()) -> tuple[int, str, str]:
        args = ["config", "--dotenv", str(tmp_path / "no.env"), *extra]
        for s in sets:
            args += ["--set", s]
        rc = main(args)
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


BAD = [
    "trainer.micro_batch_size_per_gpu=-2",
    "trainer.total_steps=-5",
    "buffer.total_steps=0",
    "algorithm.optimizer.lr=-1",
    "algorithm.optimizer.lr=.nan",
    "algorithm.optimizer.betas=[0.9, 1.5]",
    "algorithm.optimizer.lr_warmup_steps=-2",
    "nats.ack_wait=-1",
    "nats.fetch_batch=0",
    "nats.publish_timeout=-1",
    "nats.duplicate_window=-1",
    "nats.max_payload=-1",
    "nats.max_deliver=0",
    "nats.stream_max_bytes=0",
    "nats.connect_timeout=0",
    "nats.url=garbage",
    "nats.url=http://127.0.0.1:4222",
    "nats.url=nats://127.0.0.1:4222,",
    "synchronizer.sync_timeout=-1",
    "explorer.eval_interval=-1",
    "explorer.max_retry_times=-1",
    "trainer.save_interval=-1",
    "trainer.grad_clip=-1",
    "model.top_p=0",
    "model.max_model_len=0",
    "cluster.node_num=0",
    "explorer.rollout_model.gpu_memory_utilization=1.5",
]


@pytest.mark.parametrize("setting", BAD)
def test_out_of_range_value_exits_2_naming_the_field(config, setting):
    field, _, value = setting.partition("=")
    rc, out, err = config(setting)
    assert rc == 2, (out, err)
    assert f"{field}: got " in err or f"{field}[1]: got " in err, err  # [1]: the list item
    assert "(from cli); expected" in err and "Traceback" not in err
    assert out == ""


@pytest.mark.parametrize("setting", [
    "nats.max_deliver=-1", "nats.stream_max_bytes=-1", "nats.max_reconnect_attempts=-1",
    "algorithm.optimizer.lr_warmup_steps=-1", "model.top_k=-1", "explorer.eval_interval=0",
    "trainer.save_interval=0", "nats.stream_max_bytes=1048576",
    "nats.url=tls://a:4222, wss://b:443,127.0.0.1:4333", "nats.url=ws://[::1]",
])
def test_documented_sentinels_and_url_forms_still_load(config, setting):
    rc, out, err = config(setting)
    assert rc == 0, err


def test_secrets_print_as_stars_in_both_forms(config):
    sets = ("nats.token=s3cret", "nats.password=pw0rd", "nats.user=bob",
            "nats.url=nats://bob:hunter2@127.0.0.1:4222,nats://t0ken@10.0.0.2:4222",
            "monitor.monitor_args={api_key: k3y, uri: 'http://u:p4ss@mlflow:5000'}",
            "explorer.env_vars={HF_TOKEN: hf_x1, OPENAI_API_KEY: sk-x2}")
    for extra in ((), ("--sources",)):
        rc, out, err = config(*sets, extra=extra)
        assert rc == 0, err
        for secret in ("s3cret", "pw0rd", "hunter2", "t0ken", "k3y", "p4ss", "hf_x1", "sk-x2"):
            assert secret not in out + err, (secret, extra)
        assert "token: '***'" in out and "password: '***'" in out
        assert "nats://bob:***@127.0.0.1:4222,nats://***@10.0.0.2:4222" in out
        assert "bob" in out and "http://u:***@mlflow:5000" in out
    rc, out, err = config("nats.url=nats://bob:hunter2@127.0.0.1:badport")
    assert rc == 2 and "hunter2" not in err and "bob:***@" in err


def test_trinity_config_process_hides_the_token_and_names_a_garbage_url():
    r = trinity("config", "--set", "nats.token=s3cret")
    assert r.returncode == 0, r.stderr
    assert "s3cret" not in r.stdout + r.stderr and "token: '***'" in r.stdout
    r = trinity("config", "--set", "nats.url=garbage", "--set", "nats.fetch_batch=-3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "nats.url: got 'garbage'" in r.stderr and "nats.fetch_batch: got -3" in r.stderr


def test_non_utf8_yaml_exits_2_naming_the_file(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    r = trinity("config", "--config", str(bad))
    assert r.returncode == 2 and str(bad) in r.stderr and "UTF-8" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_non_utf8_dotenv_exits_2_naming_the_file(tmp_path, config):
    env = tmp_path / "latin1.env"
    env.write_bytes("TRINITY_NAME=caf\xe9\n".encode("latin-1"))
    rc, out, err = config(extra=("--dotenv", str(env)))
    assert rc == 2 and str(env) in err and "UTF-8" in err, err


# -- tasksets and datasets -----------------------------------------------------------------


def _data(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    rows = [{"question": f"{i}+1=?", "answer": str(i + 1)} for i in range(4)]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _model(tmp_path: Path) -> Path:
    """A folder that passes for a model before start (its config.json); nothing here loads it."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    return model


def _run_config(tmp_path: Path, data: Path, **taskset: object) -> Path:
    fmt = {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer"}
    ts = {"name": "arith", "path": str(data), "split": "train", "format": fmt, **taskset}
    cfg = {
        "project": "t", "name": "r", "mode": "both", "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 2},
        "model": {"model_path": str(_model(tmp_path)), "max_model_len": 64, "max_response_tokens": 8},
        "buffer": {"batch_size": 2, "explorer_input": {
            "taskset": ts,
            "eval_tasksets": [dict(ts, name="test", split="test")],
            "default_workflow_type": "math_workflow"}},
        "explorer": {"rollout_model": {"engine_type": "transformers"}},
        "nats": {"url": "nats://127.0.0.1:1", "embedded": False, "connect_wait": 0.5},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("case", ["empty", "no_prompt_key", "bad_split", "dpo_without_chosen"])
def test_unusable_data_fails_trinity_config_naming_key_and_file(tmp_path, config, case):
    data = _data(tmp_path)
    sets: list[str] = []
    if case == "empty":
        (data / "train.jsonl").write_text("\n")
        want = [f"{data / 'train.jsonl'}: no rows", "buffer.explorer_input.taskset:"]
    elif case == "no_prompt_key":
        sets.append("buffer.explorer_input.taskset.format.prompt_key=problem")
        want = ["buffer.explorer_input.taskset:", "line 1: missing key 'problem'", "prompt_key"]
    elif case == "bad_split":
        sets.append(f"buffer.explorer_input.eval_tasksets=[{{name: t, path: {data}, split: tset}}]")
        want = ["buffer.explorer_input.eval_tasksets[0]:", "split='tset'"]
    else:
        sets += ["mode=train", "algorithm.algorithm_type=dpo",
                 f"buffer.trainer_input.experience_buffer={{name: d, storage_type: file, path: {data}, "
                 "format: {prompt_type: plaintext, prompt_key: question}}"]
        want = ["buffer.trainer_input.experience_buffer:", "missing key 'chosen'"]
    rc, out, err = config(*sets, extra=("--config", str(_run_config(tmp_path, data))))
    assert rc == 2, err
    for w in want:
        assert w in err, (w, err)
    # the same config with the data fixed loads
    if case == "empty":
        (data / "train.jsonl").write_text('{"question": "1+1=?", "answer": "2"}\n')
        assert config(*sets, extra=("--config", str(_run_config(tmp_path, data))))[0] == 0


def test_trinity_run_refuses_unusable_data_before_any_process(tmp_path):
    data = _data(tmp_path)
    (data / "test.jsonl").write_text('{"q": "1+1=?", "answer": "2"}\n')  # no "question"
    r = trinity("run", "--config", str(_run_config(tmp_path, data)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "buffer.explorer_input.eval_tasksets[0]:" in r.stderr and "missing key 'question'" in r.stderr
    assert not (tmp_path / "ckpt").exists(), "something started before the data was checked"


# -- credentials the server refuses --------------------------------------------------------


def test_a_role_with_a_wrong_token_and_inspect_without_one_exit_2(tmp_path, nats_server_factory):
    """Exit 2: ``trinity run`` does not restart a role for what a restart cannot fix."""
    server = nats_server_factory(token="right")
    common = ["--set", f"nats.url={server.url}", "--set", "nats.embedded=false",
              "--set", f"checkpoint_root_dir={tmp_path}", "--dotenv", str(tmp_path / "no.env")]
    r = trinity("buffer", *common, "--set", "nats.token=n0tR1ght")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "authorization failed" in r.stderr and server.url in r.stderr
    r = trinity("inspect", *common)  # no token at all
    assert r.returncode == 2 and "authorization failed" in r.stderr, r.stderr


def test_trinity_run_with_a_wrong_token_exits_2_before_any_role(tmp_path, nats_server_factory):
    server = nats_server_factory(token="right")
    path = _run_config(tmp_path, _data(tmp_path))
    r = trinity("run", "--config", str(path), "--set", f"nats.url={server.url}",
                "--set", "nats.token=n0tR1ght", "--max-restarts", "0")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "authorization failed" in r.stderr and "n0tR1ght" not in r.stdout + r.stderr
    assert not (tmp_path / "ckpt").exists()


def test_connect_exit_code_separates_final_causes_from_retryable_ones(nats_server_factory):
    """The bus says whether a failed connect may work later (nothing listens yet: exit 1,
    trinity run restarts) or never (a wrong token: exit 2, final)."""
    import asyncio

    from bus.connection import connect
    from bus.errors import BusConnectError
    from bus.server import free_port
    from roles.cli import connect_exit_code
    from tests.conftest import nats_settings

    def failure(cfg):
        with pytest.raises(BusConnectError) as e:
            asyncio.run(connect(cfg, connect_wait=0.3))
        return e.value

    nobody = failure(nats_settings(f"nats://127.0.0.1:{free_port()}"))
    assert nobody.retryable and connect_exit_code(nobody) == 1
    server = nats_server_factory(token="right")
    wrong = failure(nats_settings(server.url, token="wrong"))
    assert not wrong.retryable and connect_exit_code(wrong) == 2
    assert connect_exit_code(BusConnectError("nats://h:1", "credentials file '/x' does not exist")) == 2


def test_serve_mode_refuses_a_group_baseline_and_sets_one_rollout(config):
    rc, _, err = config("mode=serve", "algorithm.algorithm_type=grpo")
    assert rc == 2 and "algorithm.advantage_fn: 'grpo'" in err and "reinforceplusplus" in err
    rc, _, err = config("mode=serve", "algorithm.algorithm_type=reinforceplusplus", "algorithm.repeat_times=4")
    assert rc == 2 and "algorithm.repeat_times: 4" in err
    rc, out, err = config("mode=serve", "algorithm.algorithm_type=reinforceplusplus",
                          "explorer.openai_api.api_key=hunter2")
    assert rc == 0, err
    assert "repeat_times: 1" in out and "hunter2" not in out  # the key prints as ***
    rc, _, err = config("explorer.openai_api.tool_call_parser=json")
    assert rc == 2 and "explorer.openai_api.tool_call_parser" in err


# -- names: workflows, reward functions, operators, algorithm parts, plugins ----------------


@pytest.mark.parametrize("setting,key,valid", [
    ("buffer.explorer_input.default_workflow_type=math_wrokflow",
     "buffer.explorer_input.taskset.default_workflow_type", "math_workflow"),
    ("buffer.explorer_input.default_reward_fn_type=acuracy_reward",
     "buffer.explorer_input.taskset.default_reward_fn_type", "accuracy_reward"),
    ("data_processor.experience_pipeline.operators=[{name: reward_shapping}]",
     "data_processor.experience_pipeline.operators[0].name", "reward_shaping"),
    ("algorithm.policy_loss_fn=ppo_clip", "algorithm.policy_loss_fn", "gspo"),
    ("algorithm.advantage_fn=grpo2", "algorithm.advantage_fn", "rloo"),
    ("algorithm.kl_loss_fn=k4", "algorithm.kl_loss_fn", "low_var_kl"),
    ("algorithm.entropy_loss_fn=entropy", "algorithm.entropy_loss_fn", "default"),
    ("algorithm.sample_strategy=stale", "algorithm.sample_strategy", "staleness_control"),
    ("algorithm.policy_loss_fn=no_such_module:loss", "algorithm.policy_loss_fn", "no_such_module"),
])
def test_a_misspelled_name_exits_2_naming_it_and_the_valid_ones(tmp_path, config, setting, key, valid):
    data = _data(tmp_path)
    rc, out, err = config(setting, extra=("--config", str(_run_config(tmp_path, data))))
    assert rc == 2, err
    assert key in err and valid in err, err


def test_simple_workflow_needs_the_reward_function_named(tmp_path, config):
    """Upstream's simple_workflow has no reward of its own: the config must name one."""
    run_cfg = ("--config", str(_run_config(tmp_path, _data(tmp_path))))
    rc, _, err = config("buffer.explorer_input.default_workflow_type=simple_workflow",
                        "buffer.explorer_input.default_reward_fn_type=null", extra=run_cfg)
    assert rc == 2 and "taskset.default_reward_fn_type: not set; workflow 'simple_workflow'" in err, err
    assert "accuracy_reward" in err
    rc, _, err = config("buffer.explorer_input.default_workflow_type=async_simple_workflow",
                        "buffer.explorer_input.default_reward_fn_type=accuracy_reward", extra=run_cfg)
    assert rc == 0, err


def test_a_sql_store_that_cannot_be_opened_is_refused_naming_the_key(tmp_path, config):
    run_cfg = ("--config", str(_run_config(tmp_path, _data(tmp_path))))
    key = "buffer.trainer_input.experience_buffer"
    rc, _, err = config(f"{key}.storage_type=sql", f"{key}.path=sqlite:///{tmp_path}/no/such/exp.db", extra=run_cfg)
    assert rc == 2 and f"{key}.path: sqlite:///{tmp_path}/no/such/exp.db: the folder" in err, err
    rc, _, err = config(f"{key}.storage_type=sql", f"{key}.path={tmp_path}/exp.db", extra=run_cfg)
    assert rc == 2 and f"{key}.path: storage_type 'sql' needs a SQLAlchemy database URL" in err, err
    rc, _, err = config(f"{key}.storage_type=queue", f"{key}.path=sqlite:///{tmp_path}/exp.db", extra=run_cfg)
    assert rc == 0 and "not implemented" not in err, err  # Trinity-RFT's queue backup: the SQL store
    assert not (tmp_path / "exp.db").exists()  # the check made no database


def test_reward_options_are_checked_before_start(tmp_path, config):
    """Upstream's grpo_math: math_rm_workflow scores with rm_gallery_reward, whose reward_fn_args
    name RM-Gallery's reward; a missing or unknown one, or a misspelt option of any reward, is
    refused naming it, not found per task at run time."""
    run_cfg = ("--config", str(_run_config(tmp_path, _data(tmp_path))))
    rm = ("buffer.explorer_input.taskset.default_workflow_type=math_rm_workflow",
          "buffer.explorer_input.taskset.default_reward_fn_type=rm_gallery_reward")
    rc, _, err = config(*rm, extra=run_cfg)
    assert rc == 2 and "taskset.reward_fn_args.reward_name: rm_gallery_reward needs it" in err, err
    rc, _, err = config(*rm, "buffer.explorer_input.taskset.reward_fn_args={reward_name: helpfulness}", extra=run_cfg)
    assert rc == 2 and "reward_name: 'helpfulness' is not one of 'math_verify_reward'" in err, err
    rc, _, err = config(*rm, "buffer.explorer_input.taskset.reward_fn_args={reward_name: math_verify_reward}",
                        extra=run_cfg)
    assert rc == 0, err
    rc, _, err = config("buffer.explorer_input.taskset.reward_fn_args={patern: x}", extra=run_cfg)
    assert rc == 2 and "taskset.reward_fn_args.patern: math_reward takes no such option" in err, err


def test_workflow_args_are_checked_before_start(tmp_path, config, monkeypatch):
    """A workflow's own settings (its check_args) are refused by the config check naming the
    taskset and the setting, not found by every task at run time."""
    run_cfg = ("--config", str(_run_config(tmp_path, _data(tmp_path))))
    judge = ("buffer.explorer_input.taskset.default_workflow_type=rubric_judge_openai_workflow",)
    monkeypatch.delenv("NO_SUCH_URL", raising=False)
    rc, _, err = config(*judge, "buffer.explorer_input.taskset.workflow_args={judge_api_base_url_env: NO_SUCH_URL}",
                        extra=run_cfg)
    assert rc == 2, err
    assert "taskset.workflow_args.judge_model_name: missing" in err, err
    assert "taskset.workflow_args.judge_api_base_url_env: environment variable NO_SUCH_URL is not set" in err, err
    monkeypatch.setenv("NO_SUCH_URL", "http://127.0.0.1:1/v1")
    rc, _, err = config(*judge, "buffer.explorer_input.taskset.workflow_args="
                                "{judge_api_base_url_env: NO_SUCH_URL, judge_model_name: judge}", extra=run_cfg)
    assert rc == 0, err
    rc, _, err = config("buffer.explorer_input.taskset.default_workflow_type=on_policy_distill_workflow",
                        "buffer.explorer_input.taskset.workflow_args={temperature: 0.7}", extra=run_cfg)
    assert rc == 2 and "taskset.workflow_args.temperature: 0.7: the teacher scores at temperature 1" in err, err


def test_trinity_run_refuses_an_unknown_workflow_before_any_process(tmp_path):
    data = _data(tmp_path)
    r = trinity("run", "--config", str(_run_config(tmp_path, data)),
                "--set", "buffer.explorer_input.default_workflow_type=math_wrokflow")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "default_workflow_type: unknown workflow 'math_wrokflow'" in r.stderr, r.stderr
    assert not (tmp_path / "ckpt").exists(), "something started before the names were checked"


PLUGIN = '''
import torch
from ops.registry import register
from ops.sampling import BatchPlan

@register("policy_loss_fn", "my_loss")
def my_loss(logprob, old_logprob, advantages, action_mask, *, ref_logprob=None, expert_mask=None,
            global_step=0, scale=1.0):
    loss = -(advantages * logprob * action_mask).sum() / action_mask.sum().clamp(min=1)
    return scale * loss, {"my_loss/called": 1.0}

@register("sample_strategy", "newest_first")
def newest_first(n, trainer_version, *, window=2):
    return BatchPlan(n, min_model_version=max(trainer_version - window, 0))
'''


def test_plugin_parts_are_accepted_by_name_and_by_import_path(tmp_path, config, monkeypatch):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "parts.py").write_text(PLUGIN)
    data = _data(tmp_path)
    cfg = str(_run_config(tmp_path, data))
    sets = ("algorithm.policy_loss_fn=my_loss", "algorithm.policy_loss_fn_args={scale: 2.0}",
            "algorithm.sample_strategy=newest_first", "algorithm.sample_strategy_args={window: 3}")
    rc, out, err = config(*sets, extra=("--config", cfg))
    assert rc == 2 and "unknown sample_strategy 'newest_first'" in err, err  # not loaded yet
    monkeypatch.setenv("TRINITY_PLUGIN_DIRS", str(plugins))
    rc, out, err = config(*sets, extra=("--config", cfg))
    assert rc == 0, err
    loaded = yaml.safe_load(out)["algorithm"]
    assert loaded["policy_loss_fn"] == "my_loss" and loaded["sample_strategy_args"] == {"window": 3}
    # a wrong hyperparameter of a plugin part is named like a built-in's
    rc, out, err = config(*sets, "algorithm.policy_loss_fn_args={scael: 2.0}", extra=("--config", cfg))
    assert rc == 2 and "'my_loss' has no argument(s) scael" in err, err
    # by import path, without a plugin folder: the module is importable from sys.path
    monkeypatch.delenv("TRINITY_PLUGIN_DIRS")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "my_losses.py").write_text("def plain_pg(logprob, old_logprob, advantages, "
                                                   "action_mask, **_):\n    return 0.0, {}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    rc, out, err = config("algorithm.policy_loss_fn=my_losses:plain_pg", extra=("--config", cfg))
    assert rc == 0, err


def test_a_plugin_that_fails_to_import_is_a_config_error_naming_the_file(tmp_path, config, monkeypatch):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "broken.py").write_text("x = 1\nraise RuntimeError('boom')\n")
    monkeypatch.setenv("TRINITY_PLUGIN_DIRS", str(plugins))
    cfg = str(_run_config(tmp_path, _data(tmp_path)))
    rc, out, err = config(extra=("--config", cfg))
    assert rc == 2 and "broken.py: RuntimeError: boom" in err, err
    monkeypatch.setenv("TRINITY_PLUGIN_DIRS", str(tmp_path / "nowhere"))
    rc, out, err = config(extra=("--config", cfg))
    assert rc == 2 and "is not a folder" in err, err


def test_monitor_args_a_backend_cannot_take_exit_2_before_any_role(config):
    rc, _, err = config("monitor.monitor_type=wandb", "monitor.monitor_args={base_url: http://x, bogus: 1}")
    assert rc == 2 and "monitor.monitor_args.bogus: not an argument of monitor_type wandb" in err
    rc, _, err = config("monitor.monitor_type=mlflow", "monitor.monitor_args={uri: 'file:///tmp/m', username: u}")
    assert rc == 0, err


def test_a_stage_that_saves_no_hf_checkpoint_for_the_next_one_exits_2(tmp_path):
    from storage.tiny import build_arithmetic_taskset, build_tiny_model

    model = build_tiny_model(tmp_path / "m")
    data = build_arithmetic_taskset(tmp_path / "d", n_train=6, n_eval=2)
    fmt = {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer"}
    cfg = {"model": {"model_path": str(model)}, "checkpoint_root_dir": str(tmp_path / "ckpt"),
           "buffer": {"explorer_input": {"taskset": {"path": str(data), "format": fmt}}},
           "stages": [{"stage_name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"},
                       "trainer": {"save_hf_checkpoint": "never"},
                       "buffer": {"trainer_input": {"experience_buffer": {
                           "storage_type": "file", "path": str(data), "format": fmt}}}},
                      {"stage_name": "grpo", "mode": "both"}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    r = trinity("config", "--config", str(tmp_path / "c.yaml"))
    assert r.returncode == 2, r.stderr
    assert ("stages[0] (sft).trainer.save_hf_checkpoint: 'never', but stage 'grpo' starts from this "
            "stage's final Hugging Face checkpoint") in r.stderr
    cfg["stages"][0]["trainer"]["save_hf_checkpoint"] = "last"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert trinity("config", "--config", str(tmp_path / "c.yaml")).returncode == 0


def test_colocate_and_a_plan_that_does_not_fit_exit_2_naming_the_fields(config):
    """mode: colocate runs on a CPU machine (weights through memory: two processes cannot
    form a broadcast group on one device); on GPUs with the transformers engine (it frees each
    batch's cache), not yet with vLLM (its sleep mode is not wired)."""
    rc, out, err = config("mode=colocate")
    assert rc == 0, err
    assert "sync_method: memory" in out
    rc, _, err = config("mode=colocate", "cluster.gpu_per_node=1")
    assert rc == 2 and "explorer.rollout_model.engine_type: vllm" in err and "not wired yet" in err, err
    rc, _, err = config("mode=colocate", "cluster.gpu_per_node=1", "explorer.rollout_model.engine_type=transformers")
    assert rc == 0, err
    rc, out, err = config("mode=colocate", "synchronizer.sync_method=nccl")
    assert rc == 0 and "mode 'colocate' uses 'memory'" in err and "sync_method: memory" in out, err
    rc, _, err = config("cluster.gpu_per_node=1")
    assert rc == 2 and "cluster.gpu_per_node: 1" in err and "none to the trainer" in err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU engine's limit")
def test_a_tensor_parallel_cpu_engine_beyond_the_numa_nodes_is_refused_where_it_would_run(config):
    """Trinity-RFT's judge models have tensor_parallel_size 2: vLLM on CPU failed minutes in,
    on every restart. ``trinity config`` may describe a config for GPU nodes: it says nothing."""
    from roles.launch.checks import numa_nodes, preflight
    from schemas.config import TrinityConfig
    from schemas.loader import ConfigError

    tp = numa_nodes() + 1
    cfg = TrinityConfig(explorer={"auxiliary_models": [{"model_path": "judge", "tensor_parallel_size": tp}]})
    with pytest.raises(ConfigError) as e:
        preflight([cfg], "explorer")
    assert (f"explorer.auxiliary_models[0].tensor_parallel_size: {tp}: vLLM on CPU runs one worker per "
            f"NUMA node and this machine has {numa_nodes()}") in str(e.value), e.value
    rc, _, err = config(f"explorer.rollout_model.tensor_parallel_size={tp}")
    assert "tensor_parallel_size" not in err


# -- every input checked before start: operator arguments, mixing weights, selector settings,
# -- every data row, prompts, the model folder (issue 49, item 3) -----------------------------


def _cfg_with(tmp_path: Path, change: Callable[[dict], None], data: Path | None = None) -> Path:
    """``_run_config`` (over ``data``, or fresh rows) with its YAML changed in place by ``change``."""
    path = _run_config(tmp_path, data or _data(tmp_path))
    raw = yaml.safe_load(path.read_text())
    change(raw)
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("operators,key", [
    ([{"name": "reward_shaping", "args": {"scale": "big"}}], "operators[0].args.scale: got 'big'"),
    ([{"name": "reward_shaping", "args": {"bias": float("nan")}}], "operators[0].args.bias: got nan"),
    ([{"name": "reward_shaping", "args": {"clip": 1}}], "operators[0].args.clip: got 1"),
    ([{"name": "reward_shaping", "args": {"clip": [1, -1]}}], "operators[0].args.clip: got [1, -1]"),
    ([{"name": "pass_rate_calculator", "args": {"success_threshold": "high"}}],
     "operators[0].args.success_threshold: got 'high'"),
    ([{"name": "pass_rate_calculator"}, {"name": "drop_equal_reward_groups", "args": {"fill": "yes"}}],
     "operators[1].args.fill: got 'yes'"),
    ([{"name": "drop_equal_reward_groups", "args": {"min_size": 2.5}}], "operators[0].args.min_size: got 2.5"),
])
def test_an_operator_argument_of_the_wrong_type_exits_2_naming_it(tmp_path, config, operators, key):
    """Each operator's arguments are checked against its signature's annotations before start:
    a wrong type used to send every group to the dead-letter stream, and the run never ended."""
    def change(raw: dict) -> None:
        raw["data_processor"] = {"experience_pipeline": {"operators": operators}}

    rc, out, err = config(extra=("--config", str(_cfg_with(tmp_path, change))))
    assert rc == 2, err
    assert f"data_processor.experience_pipeline.{key}" in err, err


def test_operator_arguments_of_the_right_types_load(tmp_path, config):
    operators = [{"name": "pass_rate_calculator", "args": {"success_threshold": 1}},
                 {"name": "reward_shaping", "args": {"scale": 2, "bias": -1.0, "clip": [-1, 1.5]}},
                 {"name": "drop_equal_reward_groups", "args": {"min_size": 2, "fill": True}}]

    def change(raw: dict) -> None:
        raw["data_processor"] = {"experience_pipeline": {"operators": operators}}

    rc, out, err = config(extra=("--config", str(_cfg_with(tmp_path, change))))
    assert rc == 0, err


def _mixed(first: dict) -> Callable[[dict], None]:
    def change(raw: dict) -> None:
        ts = raw["buffer"]["explorer_input"].pop("taskset")
        raw["buffer"]["explorer_input"]["tasksets"] = [ts | first, ts | {"name": "other", "weight": 1.0}]
    return change


@pytest.mark.parametrize("first,key", [
    ({"weight": float("inf")}, "tasksets[0].weight: got inf"),
    ({"weight": float("nan")}, "tasksets[0].weight: got nan"),
    ({"weight_schedule": [{"step": 0, "weight": 1.0}, {"step": 5, "weight": float("inf")}]},
     "tasksets[0].weight_schedule[1].weight: got inf"),
])
def test_an_infinite_or_nan_mixing_weight_exits_2_naming_it(tmp_path, config, first, key):
    """An infinite weight made every share NaN: the explorer crashed a minute in."""
    data = _data(tmp_path)
    rc, out, err = config(extra=("--config", str(_cfg_with(tmp_path, _mixed(first), data))))
    assert rc == 2, err
    assert f"buffer.explorer_input.{key}" in err and "finite" in err, err
    rc, out, err = config(extra=("--config", str(_cfg_with(tmp_path, _mixed({"weight": 1e6}), data))))
    assert rc == 0, err


@pytest.mark.parametrize("kwargs,key", [
    ({"target_reward": float("nan")}, "target_reward: got nan"),
    ({"target_reward": 5}, "target_reward: got 5"),
    ({"target_reward": -0.5}, "target_reward: got -0.5"),
    ({"tau": float("nan")}, "tau: got nan"),
    ({"tau": float("inf")}, "tau: got inf"),
    ({"tau": -1}, "tau: got -1"),
    ({"rho": float("nan")}, "rho: got nan"),
    ({"m": float("inf")}, "m: got inf"),
    ({"m": 0}, "m: got 0"),
    ({"lamb": 1}, "lamb: got 1"),
    ({"do_sample": "yes"}, "do_sample: true or false, got 'yes'"),
])
def test_difficulty_based_settings_out_of_range_exit_2_naming_them(tmp_path, config, kwargs, key):
    """Out of range, selection silently became uniform (NaN scores, or every row equally far
    from a target no pass rate reaches). Checked from the config alone: the data need not be
    there (``trinity config`` on a machine without it still refuses them)."""
    def change(raw: dict) -> None:
        ts = raw["buffer"]["explorer_input"]["taskset"]
        ts["task_selector"] = {"selector_type": "difficulty_based", "kwargs": kwargs}
        ts["path"] = str(tmp_path / "not_here")
        raw["data_processor"] = {"experience_pipeline": {"operators": [{"name": "pass_rate_calculator"}]}}

    rc, out, err = config(extra=("--config", str(_cfg_with(tmp_path, change))))
    assert rc == 2, err
    assert f"buffer.explorer_input.taskset.task_selector.kwargs.{key}" in err, err


def test_difficulty_based_settings_in_range_load(tmp_path, config):
    def change(raw: dict) -> None:
        raw["buffer"]["explorer_input"]["taskset"]["task_selector"] = {
            "selector_type": "difficulty_based",
            "kwargs": {"target_reward": 0.5, "tau": 0, "m": 8, "lamb": 0, "rho": 0, "do_sample": True}}
        raw["data_processor"] = {"experience_pipeline": {"operators": [{"name": "pass_rate_calculator"}]}}

    rc, out, err = config(extra=("--config", str(_cfg_with(tmp_path, change))))
    assert rc == 0, err


GOOD_ROW = b'{"question": "1+1=?", "answer": "2"}\n'
BAD_ROWS = {
    "not_json": (b'{"question": "2+2=?", "answer": "4"\n', "line 3: not JSON (column 36"),
    "not_utf8": (b'{"question": "2+2=\xff", "answer": "4"}\n', "line 3: not UTF-8 text (byte 0xff"),
    "not_an_object": (b'["2+2=?", "4"]\n', "line 3: expected a JSON object, got list"),
    "no_prompt_key": (b'{"answer": "4"}\n', "line 3: missing key 'question' (format.prompt_key)"),
    "list_prompt": (b'{"question": ["2+2=?"], "answer": "4"}\n',
                    "line 3: key 'question' (format.prompt_key): expected a string, got list ['2+2=?']"),
    "dict_prompt": (b'{"question": {"text": "2+2=?"}, "answer": "4"}\n',
                    "line 3: key 'question' (format.prompt_key): expected a string, got dict"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_row_after_the_first_exits_2_naming_file_and_line(tmp_path, config, case):
    """Every row is read before start, not only the first: a bad third row used to pass the
    check and fail the explorer three times. With ``skip_invalid_rows`` it is skipped (and
    counted by the reader: tests/storage/test_tasksets.py)."""
    data = _data(tmp_path)
    bad, want = BAD_ROWS[case]
    (data / "train.jsonl").write_bytes(GOOD_ROW * 2 + bad + GOOD_ROW)
    path = _run_config(tmp_path, data)
    rc, out, err = config(extra=("--config", str(path)))
    assert rc == 2, err
    assert f"buffer.explorer_input.taskset: {data / 'train.jsonl'}: {want}" in err, err
    assert "skip_invalid_rows" in err
    rc, out, err = config("buffer.explorer_input.taskset.skip_invalid_rows=true", extra=("--config", str(path)))
    assert rc == 0, err
    (data / "train.jsonl").write_bytes(bad * 2)  # nothing left to train on: refused even so
    rc, out, err = config("buffer.explorer_input.taskset.skip_invalid_rows=true", extra=("--config", str(path)))
    assert rc == 2 and "no valid rows: all 2 skipped (skip_invalid_rows); the first:" in err, err


@pytest.mark.parametrize("message,want", [
    ('"2+2=?"', "expected a list of chat messages, got str '2+2=?'"),
    ('["2+2=?"]', "message 0 is not an object with a string 'role': '2+2=?'"),
])
def test_a_messages_prompt_that_is_no_chat_exits_2_naming_file_line_and_key(tmp_path, config, message, want):
    data = _data(tmp_path)
    good = b'{"message": [{"role": "user", "content": "1+1=?"}], "answer": "2"}\n'
    (data / "train.jsonl").write_bytes(good + f'{{"message": {message}, "answer": "4"}}\n'.encode())

    def change(raw: dict) -> None:
        raw["buffer"]["explorer_input"]["taskset"]["format"] = {"prompt_type": "messages", "messages_key": "message"}

    rc, out, err = config(extra=("--config", str(_cfg_with(tmp_path, change, data))))
    assert rc == 2, err
    assert f"train.jsonl: line 2: key 'message' (format.messages_key): {want}" in err, err


def test_an_sft_row_with_a_list_prompt_exits_2_naming_file_and_line(tmp_path, config):
    data = _data(tmp_path)
    (data / "train.jsonl").write_bytes(GOOD_ROW + b'{"question": ["2+2=?"], "answer": "4"}\n')
    rc, out, err = config(
        "mode=train", "algorithm.algorithm_type=sft",
        f"buffer.trainer_input.experience_buffer={{name: s, storage_type: file, path: {data}, "
        "format: {prompt_type: plaintext, prompt_key: question, response_key: answer}}",
        extra=("--config", str(_run_config(tmp_path, data))))
    assert rc == 2, err
    assert ("buffer.trainer_input.experience_buffer: " f"{data / 'train.jsonl'}: line 2: key 'question' "
            "(format.prompt_key): expected a string, got list") in err, err


def test_trinity_run_refuses_a_bad_row_after_the_first_before_any_process(tmp_path):
    data = _data(tmp_path)
    (data / "train.jsonl").write_bytes(GOOD_ROW * 2 + b"not json\n")
    r = trinity("run", "--config", str(_run_config(tmp_path, data)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{data / 'train.jsonl'}: line 3: not JSON" in r.stderr, r.stderr
    assert not (tmp_path / "ckpt" / "t" / "r").exists(), "a run started before its data was checked"


@pytest.mark.parametrize("case", ["empty", "no_config", "file", "adapter", "checkpoint_step"])
def test_a_model_path_that_is_no_model_folder_exits_2_naming_it(tmp_path, config, case):
    """A folder that exists but holds no model failed late, inside the trainer or vLLM, without
    naming ``model.model_path``; what it seems to be instead is said."""
    model = tmp_path / "not_a_model"
    if case == "file":
        model.write_text("x")
    else:
        model.mkdir()
    if case == "no_config":
        (model / "model.safetensors").write_bytes(b"x")
        want = "is not a Hugging Face model folder: no config.json (it holds model.safetensors)"
    elif case == "adapter":
        (model / "adapter_config.json").write_text("{}")
        want = "holds a PEFT adapter, not a model: set the base model here and the adapter as model.lora_configs[0].path"
    elif case == "checkpoint_step":
        (model / "actor" / "huggingface").mkdir(parents=True)
        (model / "actor" / "huggingface" / "config.json").write_text("{}")
        want = f"is a checkpoint step folder, not a model folder: use {model / 'actor' / 'huggingface'}"
    else:
        want = {"empty": "is an empty folder", "file": "is a file"}[case]
    path = _run_config(tmp_path, _data(tmp_path))
    rc, out, err = config(f"model.model_path={model}", extra=("--config", str(path)))
    assert rc == 2, err
    assert f"model.model_path: {model} {want}" in err, err


def test_a_tokenizer_folder_is_enough_where_no_model_is_loaded(tmp_path, config):
    """An external rollout engine in ``explore`` mode loads no model: ``model.model_path`` may
    be a tokenizer folder there (the engine re-derives token ids with it)."""
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    path = _run_config(tmp_path, _data(tmp_path))
    rc, out, err = config(f"model.model_path={tokenizer}", "mode=explore",
                          "explorer.rollout_model.engine_type=external", extra=("--config", str(path)))
    assert rc == 0, err
    rc, out, err = config(f"model.model_path={tokenizer}", extra=("--config", str(path)))  # the trainer loads it
    assert rc == 2 and "model.model_path: " in err and "no config.json" in err, err
