"""Offline data tools: `atropos-sft-gen` and `atropos-dpo-gen`.

They act as the run's trainer (`pull`), keep the best sequences of each group under
upstream's rejection rules (`sft`, `dpo`, over the split of `groups`), and write jsonl
that TRL's trainers read as is (`records`, `writer`); `run` ties the pieces together.
Nothing here imports torch: a plain install runs them.
"""
