"""tools/analysis/benchmark.py (benchmarks.benchmark_models): its FLOP model and its outputs
(a tiny run, not a measurement)."""
import json

import pytest
import torch

from benchmarks import benchmark_models as benchmark
from benchmarks import timing


@pytest.fixture(scope='module')
def bench():
    return benchmark


def counted_flops(img_size, num_classes, train=False, batch=2):
    """FLOPs of a ViT-Ti/16 forward (and backward) pass as torch's FLOP counter sees them."""
    from timm.models.vision_transformer import VisionTransformer
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode
    model = VisionTransformer(img_size=img_size, patch_size=16, embed_dim=192, depth=12, num_heads=3,
                              num_classes=num_classes)
    # The math backend spells attention as matmuls, which the counter sees (the fused kernels it does not).
    with torch.set_grad_enabled(train), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = model.train(train)(torch.randn(batch, 3, img_size, img_size))
        if train:
            out.sum().backward()
    return counter.get_total_flops()


def test_flop_model_equals_torch_flop_counter(bench):
    assert bench.forward_flops('ti', 64, 16, 1000) * 2 == counted_flops(64, 1000)  # per image, batch of 2


def test_flop_model_gives_the_published_vit_sizes(bench):
    # DeiT (Touvron et al., 2021), Table 1: ViT-Ti/16, S/16 and B/16 at 224 px take 1.3, 4.6 and 17.6
    # GFLOPs (counted as multiply-adds) per image.
    published = {'ti': 1.3, 's': 4.6, 'b': 17.6}
    assert {a: round(bench.forward_flops(a, 224, 16, 1000) / 2e9, 1) for a in published} == published


# Hand-made timings for the tiny run: three rounds, in seconds per iteration, and the matmul peak
# (GFLOP/s) read around each timing.
TIMES = {'ours': [0.02, 0.01, 0.04], 'timm': [0.03, 0.02, 0.05], 'GEMM ceiling': [0.01, 0.005, 0.02]}
PEAKS = [100.0, 50.0, 100.0]


def test_tiny_run_prints_a_table_and_writes_json(bench, tmp_path, capsys, monkeypatch):
    """The models really run (warm-up, memory); the clock readings are replaced by TIMES and PEAKS,
    so every number of the report is known by hand."""
    def rounds(steps, peak_step, peak_flops, repeats, iters, peak_iters, stopwatch=None):
        assert repeats == 3 and type(stopwatch) is bench.Stopwatch  # the host clock on the CPU
        return {n: TIMES[n] for n in steps}, {n: PEAKS for n in steps}

    monkeypatch.setattr(bench, 'time_rounds', rounds)
    out = tmp_path / 'bench.json'
    threads = torch.get_num_threads()
    try:
        bench.main(['--arch', 'ti', '--img-size', '32', '--batch', '2', '--repeats', '3', '--iters', '1',
                    '--warmup', '1', '--models', 'ours', 'timm', '--bf16', 'off', '--threads', '1',
                    '--matmul-size', '256', '--out', str(out)])
    finally:
        torch.set_num_threads(threads)
    saved = json.loads(out.read_text())
    rows = {(r['model'], r['mode']): r for r in saved['rows']}
    assert set(rows) == {(m, mode) for m in ('ours', 'timm') for mode in ('infer', 'train')}
    infer, train, gemms = counted_flops(32, 1000), counted_flops(32, 1000, train=True), counted_flops(32, 0)
    for (model, mode), row in rows.items():
        assert row['times_s'] == TIMES[model] and row['peak_gflops_rounds'] == PEAKS and row['peak_mb'] > 0
        median = {'ours': 0.02, 'timm': 0.03}[model]  # the middle one of each model's three rounds
        assert row['img_per_s'] == pytest.approx(2 / median) and row['ms_per_iter'] == pytest.approx(1e3 * median)
        # The tool counts a backward pass as two forwards: within 2 % of the counter, which also
        # leaves out the input gradient of the patch embedding.
        flops, rel = (infer, 1e-12) if mode == 'infer' else (train, 0.02)
        assert row['gflops'] == pytest.approx(flops / median / 1e9, rel=rel)
        # Of peak, per round against the peak read next to it, in units of flops / 1e9: ours 1/2, 2,
        # 1/4 and timm 1/3, 1, 1/5 (median: the first round, 100 GFLOP/s).
        assert row['of_peak'] == pytest.approx(flops / median / 1e9 / 100, rel=rel)
        if mode == 'infer':  # the GEMM ceiling (the model's matmuls alone) is the fp32-inference reference
            assert row['gemm_ceiling_gflops'] == pytest.approx(gemms / 0.01 / 1e9)
            # ceiling / model time per round: ours 1/2, 1/2, 1/2; timm 1/3, 1/4, 2/5 (median 1/3)
            assert row['of_gemm_ceiling'] == pytest.approx(infer / gemms * {'ours': 1 / 2, 'timm': 1 / 3}[model])
        else:
            assert row['gemm_ceiling_gflops'] is None
    # timm / ours time per round: 1.5, 2.0, 1.25 -> median 1.5
    assert rows['ours', 'infer']['best_peer'] == 'timm' and rows['ours', 'infer']['vs_best_peer'] == pytest.approx(1.5)
    assert 'vs_best_peer' not in rows['timm', 'infer']
    assert rows['ours', 'infer']['params'] == rows['timm', 'infer']['params']  # identical shapes
    assert saved['matmul_gflops']['fp32'] > 0 and saved['matmul_gflops_after']['fp32'] > 0
    table = capsys.readouterr().out
    assert 'vs best peer' in table and table.split('vs best peer')[1].count('ours') == 2  # one row per mode


def test_peak_is_read_next_to_each_timing(bench, monkeypatch):
    """The matmul peak is read before the first model and after every model of a round; each timing
    is divided by the mean of the two readings around it. A fake clock makes the machine twice as slow
    from the middle of the second round on: model b, timed between two slow readings, keeps its
    fraction of peak although its time doubled."""
    clock = {'now': 0.0, 'calls': 0}

    def run(seconds):
        def step():
            clock['calls'] += 1
            clock['now'] += seconds * (2 if clock['calls'] > 7 else 1)
        return step

    monkeypatch.setattr(timing.time, 'perf_counter', lambda: clock['now'])
    # a round: peak, a (1 s), peak, b (3 s), peak -> calls 1-5, then 6-10; the slowdown starts at call 8
    times, peaks = bench.time_rounds({'a': run(1.0), 'b': run(3.0)}, run(0.5), peak_flops=50e9, repeats=2, iters=1,
                                     peak_iters=1)
    assert times == {'a': [1.0, 1.0], 'b': [3.0, 6.0]}
    # readings (GFLOP/s = 50 / (0.5 s x slowness)): 100, 100, 100 | 100 (call 6), 50 (call 8), 50 (call 10)
    assert peaks == {'a': [100.0, 75.0], 'b': [100.0, 50.0]}
    assert [1 / t / p for t, p in zip(times['b'], peaks['b'])] == pytest.approx([1 / 300, 1 / 300])
    clock.update(now=0.0, calls=0)  # a reading of several matmuls is their mean rate
    assert bench.time_rounds({'a': run(1.0)}, run(0.5), 50e9, repeats=1, iters=1, peak_iters=3)[1] == {'a': [100.0]}


def test_ratio_to_best_peer_is_paired_by_round(bench):
    """A machine that slows down mid-round must not decide the ranking: ours is 10 % faster than timm in
    four of five rounds; in the third the slowdown began between the two, and the ratio of medians
    would then claim 4.4x."""
    def row(model, times):
        return dict(arch='s', mode='infer', dtype='fp32', model=model, times_s=times,
                    img_per_s=8 / sorted(times)[len(times) // 2])
    rows = [row('ours', [1.0, 1.0, 1.0, 4.0, 4.0]), row('timm', [1.1, 1.1, 4.4, 4.4, 4.4]),
            row('mmpretrain', [9.0, 9.0, 9.0, 9.0, 9.0]), dict(arch='s', model='other', note='not available')]
    bench.versus_best_peer(rows)
    assert rows[0]['best_peer'] == 'timm'  # the faster peer by median throughput
    assert rows[0]['vs_best_peer'] == pytest.approx(1.1)
    assert rows[0]['img_per_s'] / rows[1]['img_per_s'] == pytest.approx(4.4)
    assert 'vs_best_peer' not in rows[1]


@pytest.mark.parametrize('how', ['--compile', '--freeze'])
def test_compiled_run_reports_a_failing_peer_and_goes_on(bench, tmp_path, monkeypatch, how):
    """``--compile`` times the models through torch.compile, ``--freeze`` through compile with frozen
    weights; a peer that fails (as mmpretrain's ViT does under compile + inference mode) becomes a note
    instead of ending the run."""
    class Broken(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError('peer cannot run this\nsecond line')

    build = bench.build_model
    # two blocks: Inductor compiles in seconds
    monkeypatch.setitem(bench.ViT.arch_zoo, 'ti', dict(embed_dims=64, num_layers=2, num_heads=2, mlp_dims=128))
    monkeypatch.setattr(bench, 'build_model', lambda name, arch, args: Broken() if name == 'timm' else build(name, arch, args))
    threads = torch.get_num_threads()
    try:
        result = bench.main(['--arch', 'ti', '--img-size', '32', '--batch', '2', '--repeats', '2', '--iters', '1',
                             '--warmup', '1', '--models', 'ours', 'timm', '--modes', 'infer', '--bf16', 'off',
                             '--threads', '1', '--matmul-size', '128', '--no-memory', how,
                             '--out', str(tmp_path / 'bench.json')])
    finally:
        torch.set_num_threads(threads)
        torch.compiler.reset()
    assert result['compile'] is True and result['freeze'] is (how == '--freeze')
    ours, = [r for r in result['rows'] if r['model'] == 'ours']
    assert ours['img_per_s'] > 0 and 'vs_best_peer' not in ours
    note, = [r['note'] for r in result['rows'] if r['model'] == 'timm']
    assert note == 'infer fp32 batch 2 failed: RuntimeError: peer cannot run this'


def test_freeze_refuses_training_mode(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(['--freeze'])  # default modes include a training step
    assert '--freeze times inference only' in capsys.readouterr().err


def test_guard_rows_give_the_guards_cost_paired_by_round(bench, tmp_path, monkeypatch):
    """``--guard`` trains our model through mmengine's OptimWrapper without and with the non-finite
    guard in the same rounds; the guard's cost is the median of the per-round time ratios."""
    times = {'ours': [0.02, 0.01, 0.04], 'ours+wrapper': [0.02, 0.01, 0.04], 'ours+guard': [0.021, 0.0099, 0.05]}

    def rounds(steps, peak_step, peak_flops, repeats, iters, peak_iters, stopwatch=None):
        return {n: times[n] for n in steps}, {n: PEAKS for n in steps}

    monkeypatch.setattr(bench, 'time_rounds', rounds)
    monkeypatch.setitem(bench.ViT.arch_zoo, 'ti', dict(embed_dims=64, num_layers=2, num_heads=2, mlp_dims=128))
    threads = torch.get_num_threads()
    try:
        result = bench.main(['--arch', 'ti', '--img-size', '32', '--batch', '2', '--repeats', '3', '--iters', '1',
                             '--warmup', '2', '--models', 'ours', '--modes', 'train', '--guard', '--threads', '1',
                             '--matmul-size', '128', '--no-memory', '--out', str(tmp_path / 'bench.json')])
    finally:
        torch.set_num_threads(threads)
    rows = {r['model']: r for r in result['rows']}
    assert set(rows) == {'ours', 'ours+wrapper', 'ours+guard'}
    # 1.05, 0.99, 1.25 -> median 1.05
    assert rows['ours+guard']['guard_cost'] == pytest.approx(1.05)
    assert 'vs_best_peer' not in rows['ours+guard'] and rows['ours+guard']['params'] == rows['ours']['params']


def test_guarded_training_step_trains_like_the_plain_one(bench, monkeypatch):
    # The guard changes nothing about a finite step: same losses and weights as the plain wrapper.
    monkeypatch.setitem(bench.ViT.arch_zoo, 'ti', dict(embed_dims=64, num_layers=2, num_heads=2, mlp_dims=128))
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])
    bench_args = bench.parse_args(['--arch', 'ti', '--img-size', '32', '--patch-size', '16'])
    weights = []
    for wrapper in ('plain', 'guarded'):
        torch.manual_seed(0)
        model = bench.build_model('ours', 'ti', bench_args)
        step = bench.make_step(model, 'train', x, y, None, wrapper=wrapper)
        for _ in range(3):
            step()
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights))


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the message on a host without CUDA')
def test_cuda_device_without_cuda_is_refused(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(['--device', 'cuda'])
    assert 'torch sees no CUDA device' in capsys.readouterr().err
