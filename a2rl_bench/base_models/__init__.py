"""Base models: the registry and conversion (`registry`), building a checkpoint once (`build`), content
hashes of checkpoints (`hashing`)."""
