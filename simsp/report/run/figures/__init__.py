"""The run report's figures as PNG bytes: the figures' inputs taken from the run (inputs.py),
the pipeline schedule (schedule.py), memory over time (memory.py), the bar charts drawn from the
metrics (bars.py), and the list of pictures with their captions (pictures.py), all drawn with
the machinery of drawing.py, pixels.py, panels.py and stage_ticks.py."""
