"""What a new constraint costs the grammar backend, measured before the engine sees it:
compiled once in a child process bounded in time and memory (`pool.py`, `child.py`),
the verdict cached by the constraint's hash (`gate.py`)."""
