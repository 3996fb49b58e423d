"""Plan before you train: predict memory and speed of every combination of techniques, pick the best that fits."""
