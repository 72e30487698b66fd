"""`atropos-launch`: a whole run from one YAML (config, supervisor, status, report)."""
