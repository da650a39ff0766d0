"""How policies learn: the learner registry, PPO maths, reward shaping and each algorithm."""
