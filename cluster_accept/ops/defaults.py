"""The drain rules' defaults, as the command line offers them: plain numbers in a module that imports nothing, so
that ``cluster-accept --help`` shows them without loading the rules (:mod:`.breaker`, :mod:`.repeats`)."""

DEFAULT_MAX_DRAIN_FRACTION = 0.10  # a run drains at most this share of its tested nodes (at least one)
# A relative finding drains once it repeats: FAIL_STREAK consecutive runs not accepted, or FAIL_SHARE of the node's
# last FAIL_WINDOW runs (:class:`.repeats.RepeatRule`).
FAIL_STREAK = 3
FAIL_SHARE = 0.5
FAIL_WINDOW = 6
