"""TF Serving's REST API page, its b64 placements and its routing, against a real server (SavedModel backend).

* The examples of tensorflow_serving/g3doc/api_rest.md ("Example", :409-499 at snapshot 9d981c5c), our own copies
  of its requests, on `saved_model_half_plus_three` built as TF Serving's export script builds it
  (tests/serving/half_plus_three.py), each with the documented answer.
* Every place a `{"b64": ...}` object can appear (row, columnar, scalar, named, nested, in `examples`): the right
  answer where TF Serving takes it, a 4xx naming why where it refuses (json_tensor.cc IsValBase64Object :358,
  JsonDecodeBase64Object :377, FillTensorProto :392, AddValueToFeature's object case :751-761); a hypothesis test
  generates placements and asserts no 5xx (issue 32: `{"inputs": {"b64": ...}}` answered 500).
* Routing (http_rest_api_util.cc regexes, http_server.cc dispatch): TF Serving's status and body.
"""

from __future__ import annotations

import base64
import json

import pytest
import requests
from half_plus_three import NAME, VERSION, build
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfship.serving.launcher import ServerProcess

STRINGS = "strings"
HELLO = base64.b64encode(b"hello").decode()


def _build_strings(version_dir):
    """`serving_default`: text string [-1] -> length int32, echo_bytes; `mixed`: x float32 [-1, 2], text -> y, echo_bytes."""
    import tensorflow as tf

    class Strings(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serving_default(self, text):
            return {"length": tf.strings.length(text), "echo_bytes": tf.identity(text)}

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x"),
                                      tf.TensorSpec([None], tf.string, name="text")])
        def mixed(self, x, text):
            return {"y": x * 2.0, "echo_bytes": tf.identity(text)}

    module = Strings()
    tf.saved_model.save(module, str(version_dir),
                        signatures={"serving_default": module.serving_default, "mixed": module.mixed})


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfs-docs")
    build(root / NAME / str(VERSION))
    _build_strings(root / STRINGS / "1")
    config = root / "models.config"
    config.write_text("model_config_list {\n" + "".join(
        f'  config {{ name: "{name}" base_path: "{root / name}" model_platform: "tensorflow" }}\n'
        for name in (NAME, STRINGS)) + "}\n")
    with ServerProcess(root, NAME, backend="saved_model", extra_args=("--model-config-file", str(config))) as server:
        yield server


def _post(server, path: str, body) -> requests.Response:
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return requests.post(server.rest_url + path, data=data, timeout=60)


# ------------------------------------------------------------------------------------------------ the page's examples
def test_status_example(docs_server):
    """api_rest.md :452-465: `GET /v1/models/saved_model_half_plus_three`."""
    answer = requests.get(f"{docs_server.rest_url}/v1/models/{NAME}", timeout=60)
    assert answer.status_code == 200
    assert answer.json() == {"model_version_status": [{"version": "123", "state": "AVAILABLE",
                                                       "status": {"error_code": "OK", "error_message": ""}}]}


def test_predict_example(docs_server):
    """api_rest.md :470-473: `{"instances": [1.0,2.0,5.0]}` -> `{"predictions": [3.5, 4.0, 5.5]}`, the numbers
    written as TF Serving writes them (WriteDecimal: `4.0`, not `4`)."""
    answer = _post(docs_server, f"/v1/models/{NAME}:predict", '{"instances": [1.0,2.0,5.0]}')
    assert answer.status_code == 200 and answer.json() == {"predictions": [3.5, 4.0, 5.5]}
    assert "[3.5,4.0,5.5]" in answer.text.replace(" ", "")


def test_regress_example(docs_server):
    """api_rest.md :479-483: `:regress` with signature `tensorflow/serving/regress` -> `{"results": [3.5, 4.0]}`
    (refused 400 before issue 32: the signature declares its example input DT_FLOAT, as the testdata's does)."""
    body = '{"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}, {"x": 2.0}]}'
    answer = _post(docs_server, f"/v1/models/{NAME}:regress", body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"results": [3.5, 4.0]}


def test_unknown_model_example(docs_server):
    """api_rest.md :491-497: `half:predict` -> 404, JSON, `Servable not found for request: Latest(half)`."""
    answer = _post(docs_server, "/v1/models/half:predict", '{"instances": [1.0,5.0]}')
    assert answer.status_code == 404 and answer.headers["Content-Type"].startswith("application/json")
    assert answer.json()["error"].startswith("Servable not found for request: Latest(half)")


def test_classify_answer_layout(docs_server):
    """api_rest.md "Response format" (:124-139): `{"result": [[[label, score], ...], ...]}` -- the page says
    `result`, TF Serving's code writes `results` (json_tensor.cc:82 kClassifyRegressResponseKey), as we do."""
    body = {"signature_name": "tensorflow/serving/classify", "examples": [{"x": 1.0}, {"x": 2.0}]}
    answer = _post(docs_server, f"/v1/models/{NAME}:classify", body)
    assert answer.status_code == 200 and answer.json() == {"results": [[["", 3.5]], [["", 4.0]]]}


def test_floats_in_answers_are_written_in_tf_servings_form(docs_server):
    """0.5 * 2871548594 + 3 = 1435774300 in float32 is written `1.43577434e+09` (issue 32's example)."""
    answer = _post(docs_server, f"/v1/models/{NAME}:predict", '{"instances": [2871548594.0]}')
    assert answer.status_code == 200 and "1.43577434e+09" in answer.text, answer.text


def test_zero_rows_are_refused(docs_server):
    """Difference (documented): TF Serving feeds a `[0]` tensor from `{"inputs": []}` to the model; tfship
    refuses a batch of 0 rows on every backend (their runtimes disagree on empty batches)."""
    answer = _post(docs_server, f"/v1/models/{NAME}:predict", '{"inputs": []}')
    assert answer.status_code == 400 and "batch of 0 rows" in answer.json()["error"]


# ------------------------------------------------------------------------------------------------ b64 placements
PLACEMENTS = [
    # (signature, body, status, answer or error fragment)
    ("serving_default", {"instances": [{"b64": HELLO}]}, 200,
     {"predictions": [{"length": 5, "echo_bytes": {"b64": HELLO}}]}),  # json_tensor_test SingleUnnamedTensorBase64Lists
    ("serving_default", {"instances": [{"text": {"b64": HELLO}}]}, 200,
     {"predictions": [{"length": 5, "echo_bytes": {"b64": HELLO}}]}),  # SingleNamedTensorBase64
    ("serving_default", {"instances": [[{"b64": HELLO}]]}, 200,
     {"predictions": [{"length": [5], "echo_bytes": [{"b64": HELLO}]}]}),  # nested: rank left to the model
    ("serving_default", {"inputs": [{"b64": HELLO}, "s"]}, 200,
     {"outputs": {"length": [5, 1], "echo_bytes": [{"b64": HELLO}, {"b64": "cw=="}]}}),
    ("serving_default", {"inputs": {"b64": HELLO}}, 200,  # SingleUnnamedTensorBase64Scalars: a scalar (was 500)
     {"outputs": {"length": 5, "echo_bytes": {"b64": HELLO}}}),
    ("serving_default", {"inputs": {"text": {"b64": HELLO}}}, 200, {"outputs": {"length": 5, "echo_bytes": {"b64": HELLO}}}),
    ("serving_default", {"inputs": {"text": [{"b64": "aGk"}]}}, 200,  # unpadded, as absl::Base64Unescape takes it
     {"outputs": {"length": [2], "echo_bytes": [{"b64": "aGk="}]}}),
    ("mixed", {"inputs": {"text": {"b64": HELLO}, "x": [1.0, 2.0]}}, 200,  # was 500
     {"outputs": {"y": [2.0, 4.0], "echo_bytes": {"b64": HELLO}}}),
    ("mixed", {"instances": [{"text": {"b64": HELLO}, "x": [1.0, 2.0]}]}, 200,
     {"predictions": [{"y": [2.0, 4.0], "echo_bytes": {"b64": HELLO}}]}),
    # refusals (TF Serving's words)
    ("serving_default", {"inputs": {"b64": 3}}, 400, "not formatted correctly for base64 data"),
    ("serving_default", {"inputs": [{"b64": HELLO, "more": 1}]}, 400, "not formatted correctly for base64 data"),
    ("serving_default", {"instances": [{"b64": "!!"}]}, 400, "Unable to base64 decode"),
    ("serving_default", {"inputs": {"b64": HELLO, "x": 1}}, 400, "Missing named input: text in 'inputs' object."),
    ("serving_default", {"inputs": [{"text": {"b64": HELLO}}]}, 400, "not formatted correctly for base64 data"),
    ("mixed", {"inputs": {"text": [{"b64": HELLO}], "x": {"b64": "AA=="}}}, 400,
     "JSON Value: {\"b64\":\"AA==\"} Type: Object is not of expected type: float"),
    ("mixed", {"inputs": {"b64": HELLO}}, 400, "inputs is a plain value/list, but expecting an object"),
    ("mixed", {"instances": [{"b64": HELLO}]}, 400, "instances is a plain list, but expecting list of objects"),
]


@pytest.mark.parametrize(("signature", "body", "status", "expected"), PLACEMENTS)
def test_b64_placements(docs_server, signature, body, status, expected):
    answer = _post(docs_server, f"/v1/models/{STRINGS}:predict", {"signature_name": signature, **body})
    assert answer.status_code == status, answer.text
    if status == 200:
        assert answer.json() == expected
    else:
        assert expected in answer.json()["error"]


@pytest.mark.parametrize(("feature", "status", "expected"), [
    ({"b64": "aGk="}, 200, {"results": [3.5]}),  # a bytes feature the model does not parse: ignored by it
    ({"b64": "!!"}, 400, "Unable to base64 decode"),
    ({"b64": "aGk=", "z": 1}, 400, "has element with unexpected JSON type: Object"),
    ([{"b64": "aGk="}, {"b64": "aGk"}], 200, {"results": [3.5]}),
])
def test_b64_in_examples(docs_server, feature, status, expected):
    """json_tensor.cc AddValueToFeature (:737), its object case (:751-761): a b64 object is a bytes_list value."""
    body = {"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0, "name": feature}]}
    answer = _post(docs_server, f"/v1/models/{NAME}:regress", body)
    assert answer.status_code == status, answer.text
    assert answer.json() == expected if status == 200 else expected in answer.json()["error"]


B64_VALUES = st.sampled_from([{"b64": HELLO}, {"b64": "aGk"}, {"b64": "!!"}, {"b64": 3}, {"b64": None},
                              {"b64": HELLO, "x": 1}, {"b64": [HELLO]}, {}, "plain", 1.5])


@st.composite
def b64_bodies(draw):
    """(path, body): a b64-ish value placed anywhere a tensor or feature value can be."""
    value = draw(B64_VALUES)
    nest = draw(st.integers(0, 2))
    for _ in range(nest):
        value = [value] * draw(st.integers(0, 2))
    form = draw(st.sampled_from(["row", "row_named", "columnar", "columnar_named", "examples", "context"]))
    signature = draw(st.sampled_from(["serving_default", "mixed"]))
    x = draw(st.sampled_from([[1.0, 2.0], {"b64": "AA=="}, 1.0]))
    if form in ("examples", "context"):
        key = "examples" if form == "examples" else "context"
        body = {"signature_name": "tensorflow/serving/regress", "examples": [{"x": 1.0}]}
        body[key] = [{"x": 1.0, "name": value}] if key == "examples" else {"name": value}
        return f"/v1/models/{NAME}:{draw(st.sampled_from(['regress', 'classify']))}", body
    named = {"text": value, "x": x} if signature == "mixed" else {"text": value}
    body = {"signature_name": signature, **{
        "row": {"instances": [value]}, "row_named": {"instances": [named]},
        "columnar": {"inputs": value}, "columnar_named": {"inputs": named}}[form]}
    return f"/v1/models/{STRINGS}:predict", body


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(case=b64_bodies())
def test_b64_placements_never_answer_5xx(docs_server, case):
    path, body = case
    answer = _post(docs_server, path, body)
    assert answer.status_code < 500, (body, answer.text)
    assert answer.status_code == 200 or answer.json().get("error"), answer.text


# ------------------------------------------------------------------------------------------------ routing
@pytest.mark.parametrize(("method", "path", "status", "body"), [
    # outside (?i)/v1/.* TF Serving's dispatcher declines the request: libevent's 404 page (http_server.cc)
    ("GET", "/", 404, "<HTML><HEAD>\n<TITLE>404 Not Found</TITLE>\n</HEAD><BODY>\n<H1>Not Found</H1>\n</BODY></HTML>\n"),
    ("POST", "/foo:predict", 404, "<TITLE>404 Not Found</TITLE>"),
    # under /v1/, a path or method its regexes do not take: 400 `Malformed request` (http_rest_api_handler.cc)
    ("GET", "/v1/foo", 400, "Malformed request: GET /v1/foo"),
    ("PUT", f"/v1/models/{NAME}", 400, f"Malformed request: PUT /v1/models/{NAME}"),
    ("POST", f"/v1/models/{NAME}/metadata", 400, f"Malformed request: POST /v1/models/{NAME}/metadata"),
    ("GET", "/v1/models", 400, "Missing model name in request."),  # ProcessModelStatusRequest, empty name
])
def test_routing_answers(docs_server, method, path, status, body):
    answer = requests.request(method, docs_server.rest_url + path, data=b"{}", timeout=60)
    assert answer.status_code == status
    if status == 404:
        assert answer.headers["Content-Type"].startswith("text/html") and body in answer.text
    else:
        assert answer.json() == {"error": body}


def test_error_bodies_are_written_as_tf_serving_writes_them(docs_server):
    """json_tensor.cc MakeJsonFromStatus (:1129-1138) writes `{"error": ...}` with RapidJSON's PrettyWriter."""
    answer = requests.get(f"{docs_server.rest_url}/v1/foo", timeout=60)
    assert answer.text == '{\n    "error": "Malformed request: GET /v1/foo"\n}'
    answer = _post(docs_server, f"/v1/models/{NAME}:predict", '{"instances": ["é"]}')
    assert answer.status_code == 400 and 'JSON Value: \\"é\\" Type: String' in answer.text  # UTF-8, not \\u00e9
