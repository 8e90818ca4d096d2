"""`r1desk-cli bench --batch` (model_loader.bench_batch) on the tiny model (CPU): batches of sequences decoded
together, timed, and every text compared with the same prompt decoded alone."""


def test_the_batch_bench_times_steady_decoding_and_compares_every_text_with_it_alone(cpu_engine):
    from model_loader.bench_batch import run_batch

    r = run_batch(cpu_engine, [1, 3], prompt_tokens=40, new_tokens=12, block_size=16)
    rows = r["batches"]
    assert [row["sequences"] for row in rows] == [1, 3]
    assert all(row["decode_tok_s"] > 0 and row["steps"] >= 12 for row in rows)
    # the CPU is batch-invariant: every text equals its prompt decoded alone, with an empty prefix cache each time
    assert [row["matches_alone"] for row in rows] == [[12], [12, 12, 12]]
