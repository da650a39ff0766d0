"""Other libraries' interfaces to the env and learners (Tianshou)."""
