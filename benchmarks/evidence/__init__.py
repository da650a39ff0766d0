"""The evidence: a study folder's records read as numbers, and what they support.

`records` (a run's numbers and the record format), `intervals` and `stats` (intervals over
seeds, tests, trends), `trajectories` (what a claim reads: paired seeds and the learning gate),
`frontier` (matched points on the reward–KL frontier), `budgets` (what each arm spent),
`pioneer` (models read at equal pioneer iterations), `claims` (the paper's claims, decided),
`transfer` (how a mechanism measurement is read) and `plan` (a pre-stated plan's rows).
None of it touches a model.
"""
