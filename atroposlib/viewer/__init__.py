"""`view-run` and `view-run-multimodal`: look at the groups a running trajectory API serves.

The pure part (`render`: groups to HTML, reusing the static jsonl viewer's renderer) and
the pulling part (`source`) need no Gradio; only `app` imports it, and only when a tool
runs, so importing atroposlib never requires Gradio.
"""
