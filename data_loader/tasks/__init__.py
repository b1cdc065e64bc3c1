"""Worked examples of other task shapes than classification: each module holds a loader and a
write_* function that writes synthetic data as files, the way a user's data would be."""
