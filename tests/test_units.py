import pytest

from planner.errors import InputError
from planner.units import parse_bandwidth, parse_size, parse_time


@pytest.mark.parametrize(
    "text,expected",
    [
        ("64GB", 64 * 10**9), ("64GiB", 64 * 2**30), ("512MB", 512 * 10**6), ("6.4e10", 64 * 10**9),
        ("1.5 TB", 15 * 10**11), ("100", 100), ("2kib", 2048), (4096, 4096),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["-1GB", "0", "0GB", "12XB", "GB", "", "1e400", "nan", "64 G B"])
def test_bad_sizes(text):
    with pytest.raises(InputError) as err:
        parse_size(text, "--hbm")
    assert "--hbm" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "text,expected",
    [("40GB/s", 40e9), ("37GiB/s", 37 * 2**30), ("33.6 GB/s", 33.6e9), ("1e9B/s", 1e9), (1e9, 1e9)],
)
def test_bandwidths(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


# A bare number is an error: 40 could mean GB/s as easily as B/s.
@pytest.mark.parametrize("text", ["-5GB/s", "0GB/s", "fast", "40GB/h", "40XB/s", "10Gbps", "40", "1e9", "40GB"])
def test_bad_bandwidths(text):
    with pytest.raises(InputError):
        parse_bandwidth(text)


def test_times():
    assert parse_time("5us") == pytest.approx(5e-6)
    assert parse_time("1.5ms") == pytest.approx(1.5e-3)
    assert parse_time("0") == 0  # the same in every unit
    assert parse_time(2e-6) == pytest.approx(2e-6)  # a Python number is seconds
    with pytest.raises(InputError):
        parse_time("-1s")
    with pytest.raises(InputError):
        parse_time("soon")


@pytest.mark.parametrize("text", ["5", "1.5", "1e-6", "5 sec", "5h"])
def test_times_need_a_unit(text):
    """``--latency d2h=5`` was read as 5 seconds; text needs its unit."""
    with pytest.raises(InputError) as err:
        parse_time(text, "--latency d2h")
    assert "--latency d2h" in str(err.value) and "\n" not in str(err.value)
