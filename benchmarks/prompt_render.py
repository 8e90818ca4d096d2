"""What do rendering and tokenizing a chat's prompt cost before its first token (a development tool)?

Each turn the whole conversation goes through the chat template and the tokenizer; the engine counts that time
in TTFT (GenerationStats.prompt_ms). This times ChatFormat.render over a chat that grows turn by turn (the
replies' reasoning dropped from the history, as the window does), and a regeneration of each turn, with the
incremental tokenizer (model_loader.prompt_encoding) and with a full tokenization every time; "after
prepare()": the history with the last reply tokenized once that reply ended, as Engine.generate does. CPU only.
usage: python -m benchmarks.prompt_render MODEL_DIR [--turns 8] [--user-words 300] [--answer-words 600]
"""

import argparse
import random
import statistics
import time
from pathlib import Path

from model_loader.chat import ChatFormat
from model_loader.tokenizer import load_tokenizer

WORDS = (
    "the model thinks about prime numbers and writes code def f(x): return x*x so 你好 世界 then checks "
    "every case once more"
).split()


def chat_turns(turns: int, user_words: int, answer_words: int, seed: int = 0):
    rng = random.Random(seed)

    def words(n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    messages = []
    for _ in range(turns):
        messages.append({"role": "user", "content": words(user_words)})
        yield list(messages)
        messages.append(
            {"role": "assistant", "content": f"<think>\n{words(4 * answer_words)}\n</think>\n\n" + words(answer_words)}
        )


def time_ms(fn, repeats: int = 5) -> float:
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--user-words", type=int, default=300)
    ap.add_argument("--answer-words", type=int, default=600)
    args = ap.parse_args()
    tokenizer = load_tokenizer(Path(args.model))
    incremental, full = ChatFormat(tokenizer, []), ChatFormat(tokenizer, [])
    full.prompt_encoder = None
    print("turn  prompt ids  full (ms)  follow-up  after prepare()  regenerate   (incremental, ms)")
    previous = None
    for turn, messages in enumerate(chat_turns(args.turns, args.user_words, args.answer_words), start=1):
        ids = len(full.render(messages).ids)
        full_ms = time_ms(lambda: full.render(messages))

        def follow_up(prepared: bool):  # from the last turn's prompt to this one, as a chat goes
            incremental.render(previous)
            if prepared:  # what the engine does once a reply is done: the history with the reply, tokenized
                incremental.prepare(messages[:-1])
            t = time.perf_counter()
            incremental.render(messages)
            return (time.perf_counter() - t) * 1000.0

        follow = prepared = "-"
        if previous is not None:
            follow = f"{statistics.median(follow_up(False) for _ in range(5)):.2f}"
            prepared = f"{statistics.median(follow_up(True) for _ in range(5)):.2f}"
        regen_ms = time_ms(lambda: incremental.render(messages))
        print(f"{turn:>4}  {ids:>10,}  {full_ms:>9.2f}  {follow:>10}  {prepared:>17}  {regen_ms:>10.2f}")
        previous = messages


if __name__ == "__main__":
    main()
