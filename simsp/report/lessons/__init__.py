"""`simsp ring`'s output below the command: the nccl-tests style tables of ring collectives
(nccl_table.py) and all-to-alls (all_to_all_table.py), the ring lesson (ring.py, the model;
ring_text.py, ring_page.py with its script ring_page_script.py, ring_slides.py, its renderings)
and the ring attention lesson (ring_attention.py; ring_attention_text.py, ring_attention_page.py);
`simsp schedule`'s pipeline-schedule lesson (schedule.py; schedule_text.py, schedule_page.py);
stepping_js.py, the script the three pages share; ring_flags.py and attention_flags.py, the
sizes, placement and attention layer `simsp ring` reads from its flags."""

RING_ATTENTION = "ring_attention"  # `simsp ring --collective ring_attention`
