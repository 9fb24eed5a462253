"""The real `python -m mlx_lm.server` as a distributed job: a small random Llama written to
disk in mlx-lm's format (config.json, model.safetensors, a `tokenizers` tokenizer; no
download), served by ring ranks on 127.0.0.1 the way `mlx.launch` starts them
(`MLX_HOSTFILE`, `MLX_RANK`), instrumented by `MLX_WATCHDOG=1` only."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.ranks import DaemonProc, RankProcs, base_env, free_ports, wait_for
from watchdog import record

VOCAB = 512
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build_model(folder: Path, layers: int = 2, hidden: int = 64) -> Path:
    """A random Llama mlx-lm loads like any model folder; returns the folder."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    config = dict(model_type="llama", hidden_size=hidden, num_hidden_layers=layers,
                  intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2,
                  rms_norm_eps=1e-5, vocab_size=VOCAB, max_position_embeddings=8192,
                  rope_theta=10000.0, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2)
    mx.random.seed(7)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    (folder / "config.json").write_text(json.dumps(config))

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the quick brown fox jumps over the lazy dog " * 4,
              "a watchdog ends a hung collective and names the culprit " * 4,
              "hello world, how are you today? fine, thank you. " * 4]
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
        "eos_token": "</s>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    return folder


class LmServer(RankProcs):
    """`python -m mlx_lm.server --model DIR` over `size` ring ranks; rank 0 serves HTTP."""

    def __init__(self, workdir: Path, record_dir: Path, model: Path, size: int = 2,
                 env: dict[str, str] | None = None) -> None:
        self.workdir, self.size, self.model = workdir, size, model
        ports = free_ports(size + 1)
        self.port = ports[-1]
        hostfile = workdir / "server-hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in ports[:size]]))
        self.env = base_env(record_dir, MLX_WATCHDOG="1", **(env or {}))
        self.env["MLX_HOSTFILE"] = str(hostfile)
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> LmServer:
        for rank in range(self.size):
            env = dict(self.env, MLX_RANK=str(rank))
            log = open(self.workdir / f"server-rank{rank}.log", "wb")  # noqa: SIM115
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "mlx_lm.server", "--model", str(self.model),
                 "--host", "127.0.0.1", "--port", str(self.port), "--max-tokens", "64"],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir))
            log.close()
        wait_for(self.ready, 180, interval=0.2, what="mlx_lm.server to answer")
        return self

    def log(self, rank: int) -> str:
        return (self.workdir / f"server-rank{rank}.log").read_text(errors="replace")

    def ready(self) -> bool:
        if any(p.poll() is not None for p in self.procs):
            raise AssertionError(f"a server rank exited:\n{self.log(0)[-3000:]}\n"
                                 f"{self.log(1)[-3000:]}")
        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def chat(self, text: str, max_tokens: int = 16, timeout: float = 120) -> dict[str, Any]:
        """One real `/v1/chat/completions` request; its JSON answer."""
        body = json.dumps({"messages": [{"role": "user", "content": text}],
                           "max_tokens": max_tokens, "temperature": 0.0}).encode()
        request = urllib.request.Request(self.url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return dict(json.loads(answer.read()))

    def records(self) -> dict[int, record.Record]:
        """Each rank's record, by rank number."""
        found = {}
        folder = Path(self.env["MLX_WATCHDOG_DIR"])
        for pid in self.pids:
            path = folder / f"{pid}{record.SUFFIX}"
            try:
                r = record.read_path(str(path))
            except (OSError, record.RecordError):
                continue
            found[r.rank] = r
        return found



class DefaultDaemon(DaemonProc):
    """The real daemon at its default settings: only the directories and the address
    are given, as a user who installs it and changes nothing runs it."""

    def __init__(self, record_dir: Path, state_dir: Path) -> None:
        super().__init__(record_dir, state_dir)
        self.argv = [sys.executable, "-m", "watchdog.cli", "run", "--dir", str(record_dir),
                     "--state-dir", str(state_dir), "--listen", "127.0.0.1:0",
                     "--log-level", "debug"]
