"""What the `leantrain` command runs: the argument parser (`cli`), starting processes (`launch`), `bench`, `plan`
and its probes. The top layer: it may import anything below, and nothing imports it."""
