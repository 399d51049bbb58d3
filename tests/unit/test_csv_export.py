"""The analytics' CSV cells: a text a spreadsheet would run as a formula is written as text (OWASP
CSV injection), every other value as it is; and a CR in a text never splits its row."""

import csv
import io

import pytest

from services.metering.csv_export import cell, lines


@pytest.mark.parametrize("text", ['=HYPERLINK("http://evil.example","x")', "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1"])
def test_a_formula_like_text_is_prefixed_with_a_quote(text):
    assert cell(text) == "'" + text


@pytest.mark.parametrize("value", ["curl/8.5.0", "/api/geo/projects", "sk-ab12...cd34", "2026-11-22T08:00:00+00:00", "", "a=b"])
def test_other_text_is_kept(value):
    assert cell(value) == value


@pytest.mark.parametrize(("value", "written"), [(-5, -5), (-0.5, -0.5), (0, 0), (None, ""), (True, "true"), (False, "false")])
def test_numbers_stay_numbers_and_none_and_booleans_read_as_in_the_json(value, written):
    assert cell(value) == written


def test_a_carriage_return_in_a_text_stays_inside_its_cell():
    written = lines([["\rp", "x"], ["a\r\nb", "=y"]])
    assert list(csv.reader(io.StringIO(written, newline=""))) == [["'\rp", "x"], ["a\r\nb", "'=y"]]
