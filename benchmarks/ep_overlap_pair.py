"""Print one MoE layer's forward-and-backward pair on the two streams, with and without
--delay-wgrad-compute (training/pipeline/ep_overlap.py; the pieces of tests/test_ep_overlap_pair.py).

    python benchmarks/ep_overlap_pair.py
"""

from simsp.training.pipeline.ep_overlap import LayerPieces, pair_timeline

F = LayerPieces(pre_dispatch=3.0, dispatch=2.0, mlp=4.0, combine=2.0)  # seconds
B = LayerPieces(pre_dispatch=5.0, dispatch=6.0, mlp=6.0, combine=1.0, mlp_dw=3.0,
                pre_dispatch_dw=2.0)


def main() -> None:
    """Each setting's spans, end, hidden and exposed all-to-all seconds."""
    for delay in (False, True):
        t = pair_timeline(F, B, delay_wgrad=delay)
        print(f"delay_wgrad_compute={delay}: end {t.end_s:g} s, all-to-all hidden "
              f"{t.comm_hidden_s:g} s, exposed {t.comm_exposed_s:g} s")
        for who, piece, stream, start, end in t.spans:
            print(f"  {stream:8s} {who}.{piece:16s} {start:6g} .. {end:6g}")


if __name__ == "__main__":
    main()
