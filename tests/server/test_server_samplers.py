"""Choosing a sampler through the server: A1111's names and fields (the real webuiapi client, its defaults too),
the native API's strict checks, and what the pictures and the listings say."""

from __future__ import annotations

import base64
import io
import json

import pytest
from PIL import Image
from test_server import SMALL, call, running

from anima_rknn.sampling.samplers import SAMPLER_NAMES, SAMPLERS, sampler_name

webuiapi = pytest.importorskip("webuiapi")


@pytest.fixture(scope="module")
def server(queue):
    with running(queue) as url:
        yield url, queue


def _client(url: str):
    host, port = url.removeprefix("http://").split(":")
    return webuiapi.WebUIApi(host=host, port=int(port))


def _fields(infotext: str) -> list[str]:
    return infotext.split("\n")[-1].split(", ")


def _txt2img(url: str, **body) -> dict:
    code, answer = call(f"{url}/sdapi/v1/txt2img", {"prompt": "a red circle", "seed": 3, **SMALL, **body})
    assert code == 200, answer
    info = json.loads(answer["info"])
    image = Image.open(io.BytesIO(base64.b64decode(answer["images"][0])))
    assert info["infotexts"][0] == image.info["parameters"]  # the PNG says what the answer says
    return info


def test_the_webuiapi_clients_default_call_works_and_runs_euler_a(server):
    url, queue = server
    # Every default of webuiapi 0.9: 512x512, 20 steps, CFG 7, "Euler a", scheduler "automatic", eta 1, s_noise 1.
    result = _client(url).txt2img(prompt="a red circle")
    assert len(result.images) == 1 and result.images[0].size == (512, 512)
    fields = _fields(result.images[0].info["parameters"])
    assert "Sampler: Euler a" in fields and "Schedule type: Simple" in fields and "Steps: 20" in fields
    assert not any(f.startswith(("Eta", "Sigma noise")) for f in fields)  # 1 is the default: not written
    assert result.info["sampler_name"] == "Euler a" and result.info["infotexts"][0] == result.images[0].info[
        "parameters"]
    job = next(j for j in queue.recent() if j.params.seed == result.info["seed"])
    assert (job.params.sampler, job.params.eta, job.params.s_noise) == ("euler_ancestral", 1.0, 1.0)


def test_the_samplers_are_listed_with_a1111s_fields_and_every_name_listed_is_taken(server):
    url, _ = server
    code, listed = call(f"{url}/sdapi/v1/samplers")
    assert code == 200 and [s["name"] for s in listed] == [s.label for s in SAMPLERS.values()]
    assert listed[1] == {"name": "Euler a", "aliases": ["euler_ancestral", "k_euler_a", "euler_a", "Euler Ancestral"],
                         "options": {}}
    second_order = {s["name"] for s in listed if s["options"].get("second_order")}
    assert second_order == {"Heun", "DPM++ SDE", "SA-Solver PECE"}
    for entry in listed:
        ours = sampler_name(entry["name"])
        assert entry["aliases"][0] == ours and all(sampler_name(alias) == ours for alias in entry["aliases"])


@pytest.mark.parametrize("sent, sampler, label", [
    ("Euler a", "euler_ancestral", "Euler a"), ("DPM++ 2M SDE", "dpmpp_2m_sde", "DPM++ 2M SDE"),
    ("DPM++ 2M", "dpmpp_2m", "DPM++ 2M"), ("Heun", "heun", "Heun"), ("LCM", "lcm", "LCM"),
    ("er_sde", "er_sde", "ER SDE"), ("k_euler", "euler", "Euler")])
def test_a1111_display_names_and_ours_pick_the_sampler_that_the_answer_and_png_name(server, sent, sampler, label):
    url, queue = server
    info = _txt2img(url, sampler_name=sent)
    assert info["sampler_name"] == label and f"Sampler: {label}" in _fields(info["infotexts"][0])
    assert queue.recent()[0].params.sampler == sampler


def test_cfgpp_ud10_ab_is_run_by_its_a1111_label_and_listed_by_the_native_api(server):
    url, queue = server
    info = _txt2img(url, sampler_name="CFG++ UD10 AB", cfg_scale=2)
    assert info["sampler_name"] == "CFG++ UD10 AB" and "Sampler: CFG++ UD10 AB" in _fields(info["infotexts"][0])
    assert (queue.recent()[0].params.sampler, queue.recent()[0].params.cfg) == ("cfgpp_ud10_ab", 2.0)
    sampler = next(s for s in call(f"{url}/api/settings")[1] if s["field"] == "sampler_name")
    assert sampler["labels"]["cfgpp_ud10_ab"] == "CFG++ UD10 AB" and "cfgpp_ud10_ab" in sampler["choices"]


def test_sampler_index_is_read_when_sampler_name_is_not_given(server):
    url, _ = server
    assert _txt2img(url, sampler_index="Heun")["sampler_name"] == "Heun"
    assert _txt2img(url, sampler_name="LCM", sampler_index="Heun")["sampler_name"] == "LCM"  # as in WebUI
    assert _txt2img(url)["sampler_name"] == "Euler"  # a request without one: the settings table's default


def test_an_old_name_with_a_schedule_after_it_means_both_unless_the_request_names_a_schedule(server):
    url, _ = server
    info = _txt2img(url, sampler_name="DPM++ 2M Karras")
    assert (info["sampler_name"], info["scheduler"]) == ("DPM++ 2M", "karras")
    assert "Schedule type: Karras" in _fields(info["infotexts"][0])
    assert _txt2img(url, sampler_name="DPM++ 2M SDE Exponential")["scheduler"] == "exponential"
    assert _txt2img(url, sampler_name="DPM++ 2M Karras", scheduler="automatic")["scheduler"] == "karras"
    named = _txt2img(url, sampler_name="DPM++ 2M Karras", scheduler="Beta")
    assert (named["sampler_name"], named["scheduler"]) == ("DPM++ 2M", "beta")
    # webuiapi sends scheduler "automatic" on every call: the name's schedule still holds.
    result = _client(url).txt2img(prompt="a red circle", seed=4, sampler_name="DPM++ 2M Karras", **SMALL)
    assert "Sampler: DPM++ 2M" in _fields(result.info["infotexts"][0]) and result.info["scheduler"] == "karras"


def test_a1111_ignores_eta_and_s_noise_for_a_sampler_without_them_and_writes_the_ones_it_uses(server):
    url, queue = server
    plain = _txt2img(url, sampler_name="Euler", eta=0.3, s_noise=0.5)
    assert not any(f.startswith(("Eta", "Sigma noise")) for f in _fields(plain["infotexts"][0]))
    assert (queue.recent()[0].params.eta, queue.recent()[0].params.s_noise) == (None, None)
    ancestral = _fields(_txt2img(url, sampler_name="Euler a", eta=0.5, s_noise=0.8)["infotexts"][0])
    assert "Eta: 0.5" in ancestral and "Sigma noise: 0.8" in ancestral
    assert (queue.recent()[0].params.eta, queue.recent()[0].params.s_noise) == (0.5, 0.8)
    er = _fields(_txt2img(url, sampler_name="ER SDE", eta=0.5, s_noise=0.7)["infotexts"][0])  # s_noise only
    assert "Sigma noise: 0.7" in er and not any(f.startswith("Eta") for f in er)


@pytest.mark.parametrize("path, body, pattern", [
    ("/sdapi/v1/txt2img", {"sampler_name": "DPM2 a"},
     "unknown sampler 'DPM2 a'; choose one of euler (Euler), euler_ancestral (Euler a)"),
    ("/sdapi/v1/txt2img", {"sampler_name": "Bogus Karras"}, "unknown sampler 'Bogus Karras'; choose one of"),
    ("/sdapi/v1/txt2img", {"sampler_index": 3}, "unknown sampler 3; choose one of"),
    ("/sdapi/v1/txt2img", {"sampler_name": "Euler a", "eta": 1.5}, "eta must be a finite number from 0 to 1"),
    ("/api/jobs", {"sampler_name": "DPM2 a"}, "unknown sampler 'DPM2 a'; choose one of euler (Euler)"),
    ("/api/jobs", {"sampler_name": "euler", "eta": 0.5}, "sampler euler has no eta; these do: euler_ancestral"),
    ("/api/jobs", {"sampler_name": "dpmpp_2m", "s_noise": 0.5}, "sampler dpmpp_2m has no s_noise"),
    ("/api/jobs", {"sampler_name": "euler_ancestral", "eta": 1.5}, "eta must be a finite number from 0 to 1"),
    ("/api/jobs", {"sampler_name": "euler_ancestral", "eta": "some"}, "eta must be a finite number"),
    ("/api/jobs", {"sampler_name": "euler_ancestral", "s_noise": 11}, "s_noise must be a finite number from 0 to 10"),
])
def test_bad_sampler_requests_get_a_400_with_one_line(server, path, body, pattern):
    url, _ = server
    code, answer = call(f"{url}{path}", {"prompt": "x", **SMALL, **body})
    assert code == 400, answer
    assert pattern in answer["error"] and "\n" not in answer["error"]


def test_the_native_api_takes_a1111_names_too_and_lists_the_samplers_in_its_settings(server):
    url, queue = server
    code, status = call(f"{url}/api/jobs", {"prompt": "x", **SMALL, "sampler_name": "DPM++ 2M SDE", "eta": 0.4})
    assert code == 200 and (status["params"]["sampler"], status["params"]["eta"]) == ("dpmpp_2m_sde", 0.4)
    queue.cancel(queue.get(status["id"]))
    by_field = {s["field"]: s for s in call(f"{url}/api/settings")[1]}
    sampler = by_field["sampler_name"]
    assert (sampler["setting"], sampler["default"], sampler["choices"]) == ("sampler", "euler", list(SAMPLER_NAMES))
    assert sampler["labels"]["euler_ancestral"] == "Euler a"
    assert [(by_field[f]["default"], by_field[f]["low"], by_field[f]["high"]) for f in ("eta", "s_noise")] == [
        (None, 0.0, 1.0), (None, 0.0, 10.0)]
