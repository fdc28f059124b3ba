"""An application answering juggler's proxies, with FastAPI.

    pip install fastapi uvicorn
    uvicorn examples.fastapi_backend:app --port 8000

and in juggler.toml one ``[[proxy]]`` per kind, each pointing at its path
(see docs/juggler/proxies.md). Users, sessions and rooms are dicts here;
yours live in your database.
"""

import time
from typing import Any

from fastapi import FastAPI

app = FastAPI()

TOKENS = {"alice-token": "alice", "bob-token": "bob"}  # bearer tokens your login hands out
SESSIONS = {"s-alice": "alice"}  # the sessionid cookie of a logged-in browser
ROOMS = {"chat:lobby": {"alice", "bob"}, "chat:admins": {"alice"}}  # who may read and write where
BANNED: set[str] = set()
TTL = 3600  # seconds a connection's credentials last before juggler asks /refresh


def refuse(code: int, reason: str) -> dict[str, Any]:
    return {"error": {"code": code, "reason": reason}}


@app.post("/juggler/connect")
async def connect(q: dict[str, Any]) -> dict[str, Any]:
    user = TOKENS.get(q.get("token") or "") or SESSIONS.get(q["cookies"].get("sessionid", ""))
    if user is None:
        return refuse(401, "log in first")
    if user in BANNED:
        return refuse(403, "banned")
    return {"result": {
        "user": user,
        "expire_at": int(time.time()) + TTL,
        "data": {"name": user.title()},
        "channels": [f"user:{user}"],  # server-side subscriptions
    }}


@app.post("/juggler/refresh")
async def refresh(q: dict[str, Any]) -> dict[str, Any]:
    if q["user"] in BANNED:
        return {"result": {"expired": True}}
    return {"result": {"expire_at": int(time.time()) + TTL}}


@app.post("/juggler/subscribe")
async def subscribe(q: dict[str, Any]) -> dict[str, Any]:
    members = ROOMS.get(q["channel"])
    if members is None:
        return refuse(404, "no such room")
    if q["user"] not in members:
        return refuse(403, "not a member")
    return {"result": {}}


@app.post("/juggler/publish")
async def publish(q: dict[str, Any]) -> dict[str, Any]:
    if q["user"] not in ROOMS.get(q["channel"], ()):
        return refuse(403, "not a member")
    data = q["data"]
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        return refuse(400, 'publish {"text": "..."}')
    # what subscribers get: the text, signed by the server's idea of who sent it
    return {"result": {"data": {"from": q["user"], "text": data["text"][:500]}}}


@app.post("/juggler/rpc")
async def rpc(q: dict[str, Any]) -> dict[str, Any]:
    if q["uri"] == "app.whoami":
        return {"result": {"data": {"user": q["user"]}}}
    if q["uri"] == "app.add":
        args = q["data"]
        if not isinstance(args, list) or not all(isinstance(x, int | float) for x in args):
            return refuse(400, "app.add takes a list of numbers")
        return {"result": {"data": sum(args)}}
    return refuse(404, f"no method {q['uri']}")
