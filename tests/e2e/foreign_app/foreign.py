"""An attacker's app: if it runs, it leaves a mark (a real one would read keys and data)."""

import json
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

server = ServerApp()
client = ClientApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    Path(str(context.run_config["server-marker"])).write_text("the attacker's ServerApp ran on the coordinator")
    content = RecordDict({"config": ConfigRecord({"marker": str(context.run_config["client-marker"])})})
    messages = [Message(content=content, message_type=MessageType.QUERY, dst_node_id=node)
                for node in grid.get_node_ids()]
    replies = grid.send_and_receive(messages, timeout=120)
    answers = [{"error": r.error.code if r.has_error() else None, "reason": r.error.reason if r.has_error() else ""}
               for r in replies]
    Path(str(context.run_config["replies"])).write_text(json.dumps(answers))


@client.query()
def query(msg: Message, context: Context) -> Message:
    Path(str(msg.content["config"]["marker"])).write_text("the attacker's ClientApp ran on a device")
    return Message(RecordDict({"config": ConfigRecord({"read": "keys/node_auth"})}), reply_to=msg)
