"""How policies learn: algorithms on structures (CORY is one), the PPO maths, KL and rewards."""
