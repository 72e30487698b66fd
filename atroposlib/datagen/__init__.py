"""Offline data tools: `atropos-sft-gen` and `atropos-dpo-gen`.

They take groups either as the run's trainer (`pull`, looped in `run`) or from a finished
run's files (`finished`, --from-run), keep the best sequences of each group under
upstream's rejection rules (`sft`, `dpo`, over the split of `groups`), and write jsonl
that TRL's trainers read as is, each distinct record once (`records`, `writer`).
Nothing here imports torch: a plain install runs them.
"""
