// read_events.mjs FILE... — prints each event of TensorBoard event files as one JSON line,
// read the way TensorBoard reads them: TFRecord framing with both masked CRC-32Cs checked
// (the npm package tfrecord's RecordReader) and each record decoded as a
// tensorflow.Event protocol buffer (protobufjs, with the fields of TensorBoard's
// event.proto and summary.proto that scalars use, declared below). Exit 1 on any error.
import { createRequire } from "module";
const require = createRequire(import.meta.url);
const protobuf = require("protobufjs");
const { RecordReader } = require("tfrecord");

const schema = `
syntax = "proto3";
package tensorflow;
message SummaryValue { string tag = 1; float simple_value = 2; string node_name = 7; }
message Summary { repeated SummaryValue value = 1; }
message SessionLog {
  enum SessionStatus { STATUS_UNSPECIFIED = 0; START = 1; STOP = 2; CHECKPOINT = 3; }
  SessionStatus status = 1; string checkpoint_path = 2; string msg = 3;
}
message Event {
  double wall_time = 1; int64 step = 2;
  oneof what { string file_version = 3; bytes graph_def = 4; Summary summary = 5;
               SessionLog session_log = 7; }
}`;
const Event = protobuf.parse(schema).root.lookupType("tensorflow.Event");

for (const file of process.argv.slice(2)) {
  const reader = await RecordReader.create(file);
  let record, index = 0;
  while ((record = await reader.readRecord()) !== null) {
    const e = Event.toObject(Event.decode(record), { longs: Number, enums: String });
    console.log(JSON.stringify({ file, index: index++, ...e }));
  }
}
