"""Silent data corruption in one place: the in-rank check (torch), the pure verdict, the agent's response."""
