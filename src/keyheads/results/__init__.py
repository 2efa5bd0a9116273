"""What each stage saves, as types: the JSON a stage writes is its result's `to_json()`, and every reader (the
run folder's, the report's, the studies') gets it back through `from_json()`, so a field has one name and one
type wherever it is read, and a file that no longer has the shape its type says fails where it is read.

One module per idea: `identify` (key_heads.json), `knockout` (knockout.json with its transfer table),
`attention`, `mlp`, `finetune` (finetune.json), `evaluation` (results.json and the rows' summaries), `run`
(model.json and the stage records). effects.json is `keyheads.effects.Effects`. Nothing here imports torch,
so the report reads a run folder on a machine without it; the package sits below `keyheads.runfolder`, which
reads every artifact through these types.
"""
