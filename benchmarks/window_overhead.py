"""How much decode speed does the window cost? Measured on any machine, without a GPU.

    QT_QPA_PLATFORM=offscreen python -m benchmarks.window_overhead --model /tmp/tiny [--step-ms 1.4] [--tokens 4096]

A simulated GPU engine runs the real engine's host loop shape: decode steps of --step-ms each are queued
`model_loader.engine.QUEUED_STEPS` deep on a "GPU" clock, the host waits for the oldest one with the GIL
released (as torch's event wait does), then detokenizes it with the real tokenizer, reasoning splitter and
answer trimmer and yields the delta. The same engine runs once on its own (what `r1desk-cli chat` measures) and
once inside the real window through the worker thread (what the self-test measures); the ratio is what the GUI
thread's share of the GIL costs. The text is a long R1-shaped reply: reasoning, then a markdown answer with a
long code block and a table, so the renderer does its real work. --text random gives the text a random model
writes instead (`make-test-model`'s, as the GPU self-test runs): token ids drawn at random from the vocabulary,
seeded, so every script and symbol the tokenizer knows comes up (font fallback, stray markdown and math);
--text r1-unlabeled the R1-shaped reply with its code block's language left out (pygments guesses it). Each
run also reports its gaps between tokens over 5 ms (host stalls), as the self-test does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from pathlib import Path

REPLY = (
    (
        "Okay, let me think about this carefully. The user wants a function that parses a log file and reports "
        "the slowest requests. First I need to decide how to read the file: line by line, so memory stays flat.\n\n"
        "Each line looks like `2024-01-01T00:00:00Z GET /path 200 123ms`. I can split on spaces; the last field "
        "is the duration. Wait, some paths could contain spaces if they are URL-encoded badly, so I should split "
        "from the right instead.\n\n"
        "Then keep a heap of the N slowest. That is O(n log N). For the report, a table is clearest.\n\n"
    )
    * 12
    + "</think>\n\n"
    + (
        "Here is a parser that streams the file and keeps the slowest requests in a heap:\n\n```python\n"
        + "".join(
            f"def step_{i}(line: str) -> tuple[str, int]:\n    parts = line.rsplit(' ', 4)\n"
            f"    return parts[2], int(parts[4].rstrip('ms'))  # field {i}\n\n"
            for i in range(40)
        )
        + "```\n\n| request | ms |\n|---|---|\n"
        + "".join(f"| /api/item/{i} | {100 + i} |\n" for i in range(30))
        + "\nThe total cost is $O(n \\log N)$ and memory is $O(N)$.\n"
    )
)


class SimulatedGpuEngine:
    """A Started, then one Delta per token at the pace of a GPU with `step_s` per decode step, then Finished."""

    def __init__(self, model_folder: str, step_s: float, tokens: int, text: str = "r1", seed: int = 0):
        import random

        from model_loader.tokenizer import load_tokenizer
        from tests.desktop.fakes import FakeInfo

        self.tokenizer = load_tokenizer(Path(model_folder))
        if text == "random":  # the base vocabulary only: a random model's special tokens would end the reply
            words = [i for t, i in self.tokenizer.get_vocab().items() if not t.startswith("<")]
            rng = random.Random(seed)
            self.ids = [rng.choice(words) for _ in range(tokens)]
        else:
            ids = self.tokenizer.encode(REPLY.replace("```python", "```") if text == "r1-unlabeled" else REPLY)
            self.ids = (ids * (tokens // len(ids) + 1))[:tokens]
        self.step_s = step_s
        self.info = FakeInfo()
        self.last_tok_s = 0.0

    def memory(self):
        from tests.desktop.fakes import FakeEngine

        return FakeEngine().memory()

    def warm_up(self, progress=None) -> None:
        pass

    def generate(self, messages, settings=None, control=None):
        from model_loader.chat import AnswerNewlineTrimmer, ReasoningSplitter, StreamingDetokenizer
        from model_loader.engine import QUEUED_STEPS
        from model_loader.events import Delta, Finished, GenerationStats, Started

        detok, splitter, trim = StreamingDetokenizer(self.tokenizer), ReasoningSplitter(True), AnswerNewlineTrimmer()
        yield Started(prompt_tokens=20, prefix_reused_tokens=0, context_length=32768)
        times: list[float] = []
        pending: deque[float] = deque()
        gpu_free = time.perf_counter()
        launched = received = 0
        parts = {"reasoning": [], "answer": []}
        while received < len(self.ids):
            while launched < len(self.ids) and len(pending) < QUEUED_STEPS:
                gpu_free = max(gpu_free, time.perf_counter()) + self.step_s  # queued behind the previous step
                pending.append(gpu_free)
                launched += 1
            wait = pending.popleft() - time.perf_counter()
            if wait > 0:
                time.sleep(wait)  # the event wait: GIL released
            tok = self.ids[received]
            received += 1
            times.append(time.perf_counter())
            for kind, text in splitter.feed(detok.add(tok)):
                text = trim(kind, text)
                if text:
                    parts[kind].append(text)
                    yield Delta(text, kind, received)
        n = len(times)
        self.last_tok_s = (n - 1) / (times[-1] - times[0])
        self.last_stalls = [(b - a) * 1000 for a, b in zip(times, times[1:]) if b - a > 0.005]
        reasoning, answer = "".join(parts["reasoning"]), "".join(parts["answer"])
        stats = GenerationStats(
            finish_reason="max_new_tokens",
            prompt_tokens=20,
            completion_tokens=n,
            reasoning_tokens=0,
            prefix_reused_tokens=0,
            context_length=32768,
            ttft_ms=1.0,
            first_answer_ms=None,
            decode_tok_s=self.last_tok_s,
            total_s=times[-1] - times[0],
            token_latencies_ms=[],
            memory=self.memory(),
        )
        yield Finished(
            text=reasoning + "</think>\n\n" + answer,
            reasoning=reasoning,
            answer=answer,
            token_ids=list(self.ids),
            stats=stats,
        )


def alone(engine: SimulatedGpuEngine) -> float:
    for _ in engine.generate([]):
        pass
    return engine.last_tok_s


def in_window(engine: SimulatedGpuEngine) -> float:
    import tempfile

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from desktop.store import Store
    from desktop.window import MainWindow

    app = QApplication.instance() or QApplication([])
    sys.setswitchinterval(0.0005)  # as desktop.app.main sets it
    tmp_dir = tempfile.TemporaryDirectory(prefix="r1desk-overhead-")  # the window's settings and chat store
    tmp = Path(tmp_dir.name)
    win = MainWindow(
        QSettings(str(tmp / "r1desk.ini"), QSettings.IniFormat),
        Store(tmp / "c.sqlite3"),
        model="/simulated",
        device="cuda",
        max_new_tokens=len(engine.ids),
    )
    win.engine_factory = lambda request, progress, on_compiling: engine
    win.resize(1280, 820)
    win.show()
    result = {}
    win.engine_ready.connect(lambda _info: win.send("Parse my log file."))
    win.reply_finished.connect(lambda msg: (result.setdefault("tok_s", msg["stats"]["decode_tok_s"]), app.quit()))
    win.start_engine()
    app.exec()
    win.close()
    win.store.close()
    tmp_dir.cleanup()
    return result["tok_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a model folder (only its tokenizer is used)")
    p.add_argument("--step-ms", type=float, default=1.4, help="simulated GPU time per decode step")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument(
        "--text",
        choices=["r1", "r1-unlabeled", "random"],
        default="r1",
        help="an R1-shaped reply, or a random model's tokens (as the GPU self-test's model writes)",
    )
    p.add_argument("--seed", type=int, default=0, help="--text random: which random tokens")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    engine = SimulatedGpuEngine(args.model, args.step_ms / 1000, args.tokens, args.text, args.seed)
    ceiling = 1000 / args.step_ms
    base, win, stalls = [], [], []
    for _ in range(args.runs):
        base.append(alone(engine))
    for _ in range(args.runs):
        win.append(in_window(engine))
        stalls.append(engine.last_stalls)
    b, w = max(base), max(win)
    print(
        f"simulated GPU {ceiling:.0f} tok/s; alone {', '.join(f'{x:.1f}' for x in base)} tok/s; "
        f"in the window {', '.join(f'{x:.1f}' for x in win)} tok/s; window/alone = {w / b:.3f}; gaps over 5 ms "
        f"in the window: {', '.join(f'{len(g)} ({sum(g):.0f} ms, max {max(g, default=0):.1f})' for g in stalls)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
