"""A study as cells, each committed as its own record when it finishes (keyheads.study.cells), run on any machine
or as jobs of a scheduler through submitit (keyheads.study.jobs)."""
