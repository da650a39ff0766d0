"""agents: LLM policies as MARL agents, token-level PPO, and the swappable learners."""
