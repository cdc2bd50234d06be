"""The scale simulator: in-process nodes answering the real commands from a recording of real nodes, for scale
work from a source checkout. Not part of the product's wheel; an inventory's ``simulation`` block loads it by
name (:func:`remote.session.simulated_session`), and is refused where it is not installed."""
