"""The schedule (vit.training.schedule): warmup by steps, then the share of the run by steps or by the time budget,
whichever is further; the lr's position and the training image size follow it; its state resumes it."""

import pytest

from vit.exits import ConfigError
from vit.training.schedule import Schedule, check_stages, image_size, progress


def test_by_steps_warmup_then_the_cosine_then_the_end():
    s = Schedule(warmup=10, decay=90, image_size=32)
    assert [s.advance(step) for step in (0, 5, 10)] == [0, 5, 10]  # warmup: the step itself
    assert s.advance(55) == 55 and s.share == pytest.approx(0.55)
    assert s.advance(100) == 100 and s.share == 1.0
    assert s.advance(150) == 100 and s.share == 1.0  # never past the end of the cosine


def test_by_time_the_budget_is_laid_over_the_cosine():
    s = Schedule(warmup=2, decay=None, image_size=32)  # open-ended: the time budget is the length
    assert s.cosine_steps == 10_000
    assert s.advance(1, (10.0, 100.0)) == 1 and s.share == pytest.approx(0.1)
    assert s.advance(3, (20.0, 100.0)) == 2 and s.warmup_end_time == 20.0  # warmup ended at 20 s
    assert s.advance(50, (60.0, 100.0)) == 2 + round(0.5 * 10_000)  # half the time after warmup
    assert s.advance(99, (100.0, 100.0)) == 2 + 10_000 and s.share == 1.0


def test_the_further_of_steps_and_time_wins():
    s = Schedule(warmup=0, decay=100, image_size=32)
    s.advance(1, (0.0, 100.0))  # warmup (none) ended at 0 s
    assert s.advance(10, (50.0, 100.0)) == 50 and s.share == pytest.approx(0.5)  # the clock is ahead
    assert s.advance(80, (60.0, 100.0)) == 80 and s.share == pytest.approx(0.8)  # the steps are ahead


def test_the_training_image_size_follows_the_share():
    s = Schedule(warmup=0, decay=100, image_size=32, stages=((16, 0.25), (24, 0.75)))
    sizes = {}
    for step in (0, 24, 25, 50, 75, 100):
        s.advance(step)
        sizes[step] = s.train_image_size()
    assert sizes == {0: 16, 24: 16, 25: 24, 50: 24, 75: 32, 100: 32}


def test_the_state_resumes_the_schedule_exactly():
    a = Schedule(warmup=2, decay=None, image_size=32, stages=((16, 0.5),))
    a.advance(5, (30.0, 100.0))
    b = Schedule(warmup=2, decay=None, image_size=32, stages=((16, 0.5),))
    b.load_state_dict(a.state_dict())
    assert (b.warmup_end_time, b.share, b.train_image_size()) == (30.0, 0.3, 16)
    assert [a.advance(9, (70.0, 100.0)), a.share] == [b.advance(9, (70.0, 100.0)), b.share]


def test_bad_stages_are_configuration_errors():
    check_stages(((16, 0.25), (24, 0.5)), 32, 4)
    with pytest.raises(ConfigError, match="the stages' ends must increase"):
        check_stages(((16, 0.5), (24, 0.25)), 32, 4)
    with pytest.raises(ConfigError, match="multiple of the patch size 4 below the image size 32, got 18"):
        check_stages(((18, 0.5),), 32, 4)
    with pytest.raises(ConfigError, match="got 32"):
        check_stages(((32, 0.5),), 32, 4)


def test_progress_and_image_size_are_functions_of_where_the_run_is():
    a = progress(50, (60.0, 100.0), warmup=2, decay=None, warmup_end_time=20.0)
    assert a == progress(50, (60.0, 100.0), warmup=2, decay=None, warmup_end_time=20.0)
    assert (a.updates, a.share, a.warmup_end_time) == (2 + 5_000, 0.6, 20.0)
    assert progress(3, (20.0, 100.0), 2, None, None).warmup_end_time == 20.0  # warmup ends at this step's time
    assert [image_size(share, ((16, 0.25), (24, 0.5)), 32) for share in (0.0, 0.25, 0.49, 0.5, 1.0)] == [16, 24, 24, 32, 32]


def test_the_lr_warms_up_then_decays_to_min_lr():
    import torch

    s = Schedule(warmup=2, decay=10, image_size=32)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = s.lr_scheduler(optimizer, 1.0, 0.0)
    lrs = {}
    for step in (0, 2, 7, 12):
        scheduler.step_update(num_updates=s.advance(step))
        lrs[step] = optimizer.param_groups[0]["lr"]
    assert lrs[0] == pytest.approx(1e-3) and lrs[2] == pytest.approx(1.0)
    assert lrs[7] == pytest.approx(0.5) and lrs[12] == pytest.approx(0.0, abs=1e-9)
