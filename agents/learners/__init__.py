"""How policies learn: learners on structures (CORY is one), the PPO maths, KL and rewards."""
