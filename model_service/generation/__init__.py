"""One generation in its own task, its replay log, and the store of resumable ones."""
