// Runs a TF.js graph model (model.json + weight shards) on the pure-JavaScript CPU backend.
//
// Usage: node run_graph_model.mjs MODEL_DIR
// Protocol (one JSON object per line): the first line on stdout describes the loaded model
//   {"ready": true, "inputs": {name: {node, dtype, shape}}, "outputs": {name: {node, dtype, shape}},
//    "backend": "cpu", "versions": {...}}
// then each request line on stdin
//   {"id": N, "inputs": {name: {"dtype": "float32"|"int32"|"bool", "shape": [...], "data": base64 LE bytes}}}
// is answered by
//   {"id": N, "outputs": {name: {"dtype", "shape", "data"}}}  or  {"id": N, "error": "..."}.
// Outputs are keyed by the SavedModel signature's output names, taken from model.json's `signature`
// (which tfship's converter step rewrites so every output carries its name and its Identity_k node).
// Nothing but protocol lines is written to stdout (console.log is sent to stderr).
import fs from 'node:fs';
import path from 'node:path';
import readline from 'node:readline';

import * as tf from '@tensorflow/tfjs-core';
import '@tensorflow/tfjs-backend-cpu';
import * as tfconv from '@tensorflow/tfjs-converter';

console.log = console.error; // tfjs-core prints a Node.js hint with console.log: keep stdout for the protocol

const ARRAYS = { float32: Float32Array, int32: Int32Array, bool: Uint8Array };

function send(message) {
  process.stdout.write(JSON.stringify(message) + '\n');
}

function loadArtifacts(modelDir) {
  const modelJson = JSON.parse(fs.readFileSync(path.join(modelDir, 'model.json'), 'utf8'));
  const specs = [];
  const buffers = [];
  for (const group of modelJson.weightsManifest) {
    specs.push(...group.weights);
    for (const shard of group.paths) {
      buffers.push(fs.readFileSync(path.join(modelDir, shard)));
    }
  }
  const joined = Buffer.concat(buffers);
  return {
    modelJson,
    artifacts: {
      modelTopology: modelJson.modelTopology,
      format: modelJson.format,
      generatedBy: modelJson.generatedBy,
      convertedBy: modelJson.convertedBy,
      signature: modelJson.signature,
      userDefinedMetadata: modelJson.userDefinedMetadata,
      modelInitializer: modelJson.modelInitializer,
      weightSpecs: specs,
      weightData: joined.buffer.slice(joined.byteOffset, joined.byteOffset + joined.byteLength),
    },
  };
}

function describe(entries) {
  const out = {};
  for (const [name, info] of Object.entries(entries || {})) {
    const dims = (info.tensorShape && info.tensorShape.dim) || [];
    out[name] = { node: info.name, dtype: info.dtype, shape: dims.map((d) => Number(d.size ?? -1)) };
  }
  return out;
}

function decode(spec) {
  const Array_ = ARRAYS[spec.dtype];
  if (!Array_) throw new Error(`input dtype ${spec.dtype} is not supported (float32, int32, bool)`);
  const bytes = Buffer.from(spec.data, 'base64');
  const values = new Array_(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  return tf.tensor(values, spec.shape, spec.dtype);
}

async function encode(tensor) {
  const values = await tensor.data();
  const data = Buffer.from(values.buffer, values.byteOffset, values.byteLength).toString('base64');
  return { dtype: tensor.dtype, shape: tensor.shape, data };
}

async function answer(model, inputs, outputs, request) {
  const feeds = {};
  for (const [name, spec] of Object.entries(request.inputs)) {
    if (!inputs[name]) throw new Error(`unknown input ${JSON.stringify(name)}; expected ${Object.keys(inputs)}`);
    feeds[inputs[name].node.split(':')[0]] = decode(spec);
  }
  const names = Object.keys(outputs);
  const nodes = names.map((name) => outputs[name].node);
  let results = await model.executeAsync(feeds, nodes);
  if (!Array.isArray(results)) results = [results];
  const encoded = {};
  for (let i = 0; i < names.length; i += 1) encoded[names[i]] = await encode(results[i]);
  tf.dispose([...Object.values(feeds), ...results]);
  return encoded;
}

async function main() {
  const modelDir = process.argv[2];
  if (!modelDir) throw new Error('usage: node run_graph_model.mjs MODEL_DIR');
  await tf.setBackend('cpu');
  await tf.ready();
  const { modelJson, artifacts } = loadArtifacts(modelDir);
  const model = await tfconv.loadGraphModel(tf.io.fromMemory(artifacts));
  const inputs = describe(modelJson.signature && modelJson.signature.inputs);
  const outputs = describe(modelJson.signature && modelJson.signature.outputs);
  send({ ready: true, inputs, outputs, backend: tf.getBackend(),
         versions: { 'tfjs-core': tf.version_core, 'tfjs-converter': tfconv.version_converter, node: process.version } });
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (!line.trim()) continue;
    let request = { id: null };
    try {
      request = JSON.parse(line);
      send({ id: request.id, outputs: await answer(model, inputs, outputs, request) });
    } catch (err) {
      send({ id: request.id, error: String(err && err.message ? err.message : err) });
    }
  }
}

main().catch((err) => {
  process.stderr.write(`run_graph_model: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
