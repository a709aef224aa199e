"""trace.json, the Chrome trace of a run (open it in Perfetto): each simulated rank's spans by
track, the pipeline transfers with a flow arrow from each send to its receive, and every
stage's memory by category as counters.

Modules, bottom up: columns.py (rows of text assembled a column at a time with numpy),
layout.py (merging over budget, lanes that nest, the calls enclosing each transfer), events.py
(complete events, flows and metadata as JSON text), plan.py (threads, lanes and spans as numeric
columns), and writer.py (the memory counters and the file). The spans themselves are recorded by
engine/trace.py during the simulation. Formatting a column at a time instead of an event at a
time is what keeps a paper-scale trace to a fraction of a second
(docs/PERFORMANCE.md#reports-formatting-a-column-at-a-time); tests/test_text_columns.py shows
the text equals what str() and repr() write.
"""
