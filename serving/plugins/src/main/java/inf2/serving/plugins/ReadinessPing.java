package inf2.serving.plugins;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.pytorch.serve.servingsdk.Context;
import org.pytorch.serve.servingsdk.Model;
import org.pytorch.serve.servingsdk.ModelServerEndpoint;
import org.pytorch.serve.servingsdk.Worker;
import org.pytorch.serve.servingsdk.annotations.Endpoint;
import org.pytorch.serve.servingsdk.annotations.helpers.EndpointTypes;
import org.pytorch.serve.servingsdk.http.Request;
import org.pytorch.serve.servingsdk.http.Response;

/**
 * {@code GET /ping} as readiness: TorchServe's own /ping counts a worker healthy as soon as its
 * process exists, before the handler's initialize() has loaded the model and run its warm-up. The
 * frontend serves a plugin's endpoint before its own routes, so this class replaces /ping.
 *
 * <p>200 {@code {"status": "Healthy"}} when nothing is draining, no worker failed to initialize,
 * every registered model has a worker whose initialize() returned (TorchServe's
 * WORKER_MODEL_LOADED), and no worker reports model replicas down. Otherwise, in this order:
 *
 * <ul>
 *   <li>503 {@code {"status": "Draining"|"Unhealthy"|"Loading", "message": ...}} while draining, a
 *       worker failed to initialize, or a model has no loaded worker yet;
 *   <li>503 {@code {"status": "Unhealthy", "message": "worker <pid>: <cause>"}} when a worker
 *       reports that none of its replicas serves;
 *   <li>200 {@code {"status": "Degraded", "message": "worker <pid>: <cause>"}} when a worker reports
 *       some of its replicas down (restarting): it still serves, with less capacity.
 * </ul>
 *
 * <p>Draining, failed starts and replica health come from the state directory named by
 * INF2_STATE_DIR (handler/serving/state.py): {@code drain.json}; {@code failed-<pid>.json} {@code
 * {"cause": ...}}; {@code replicas-<pid>.json} {@code {"status": "Degraded"|"Unhealthy", "cause":
 * ...}}. A {@code failed-} or {@code replicas-} marker counts only while process {@code <pid>} is
 * alive; an unreadable or malformed {@code replicas-} marker is skipped. Dependency-free: the JSON
 * in and out is handled here.
 */
@Endpoint(
        urlPattern = "ping",
        endpointType = EndpointTypes.INFERENCE,
        description = "Readiness: 200 once every model has a loaded, warmed-up worker")
public final class ReadinessPing extends ModelServerEndpoint {
    static final String STATE_DIR_ENV = "INF2_STATE_DIR";
    static final String DRAIN_FILE = "drain.json";
    private static final int MAX_CAUSE_CHARS = 4000;

    @Override
    public void doGet(Request req, Response rsp, Context ctx) throws IOException {
        String dir = System.getenv(STATE_DIR_ENV);
        Verdict verdict = verdict(dir == null || dir.isEmpty() ? null : Paths.get(dir), ctx.getModels());
        rsp.setStatus(verdict.code, verdict.code == 200 ? "OK" : "Service Unavailable");
        rsp.setContentType("application/json");
        rsp.setHeader("Cache-Control", "no-store");
        OutputStream out = rsp.getOutputStream();
        out.write(verdict.json().getBytes(StandardCharsets.UTF_8));
        out.flush();
    }

    static Verdict verdict(Path stateDir, Map<String, Model> models) {
        if (stateDir != null) {
            if (Files.exists(stateDir.resolve(DRAIN_FILE))) {
                return Verdict.unready(
                        "Draining", "the server is draining before it stops; send new requests elsewhere");
            }
            String failure = liveFailure(stateDir);
            if (failure != null) {
                return Verdict.unready("Unhealthy", failure);
            }
        }
        if (models.isEmpty()) {
            return Verdict.unready("Loading", "no model is registered yet");
        }
        for (Map.Entry<String, Model> entry : new TreeMap<>(models).entrySet()) {
            if (!hasLoadedWorker(entry.getValue())) {
                return Verdict.unready(
                        "Loading",
                        "model " + entry.getKey() + " has no worker that finished loading and warming up yet");
            }
        }
        if (stateDir != null) {
            Verdict replicas = replicaHealth(stateDir);
            if (replicas != null) {
                return replicas;
            }
        }
        return Verdict.HEALTHY;
    }

    private static boolean hasLoadedWorker(Model model) {
        for (Worker worker : model.getModelWorkers()) {
            if (worker.isRunning()) { // WORKER_MODEL_LOADED: the handler's initialize() returned
                return true;
            }
        }
        return false;
    }

    /** The first failed-<pid>.json of a live process, described; null when there is none. */
    static String liveFailure(Path stateDir) {
        List<LiveMarker> failed = liveMarkers(stateDir, "failed-");
        if (failed.isEmpty()) {
            return null;
        }
        LiveMarker first = failed.get(0);
        String cause = stringField(first.json, "cause");
        if (cause == null) {
            cause = "(" + first.name + " holds no readable cause)";
        }
        return "worker " + first.pid + " failed to initialize: " + truncated(cause);
    }

    /**
     * From the replicas-<pid>.json of live processes: 503 Unhealthy when one says no replica
     * serves, else 200 Degraded when one says some are down; null when none says either.
     */
    static Verdict replicaHealth(Path stateDir) {
        Verdict degraded = null;
        for (LiveMarker marker : liveMarkers(stateDir, "replicas-")) {
            String status = stringField(marker.json, "status");
            String cause = stringField(marker.json, "cause");
            if (cause == null || !("Unhealthy".equals(status) || "Degraded".equals(status))) {
                continue; // malformed: not what a worker writes
            }
            String message = "worker " + marker.pid + ": " + truncated(cause);
            if (status.equals("Unhealthy")) {
                return Verdict.unready(status, message);
            }
            if (degraded == null) {
                degraded = Verdict.degraded(message);
            }
        }
        return degraded;
    }

    /** A {@code <prefix><pid>.json} marker of a process that is alive, with its text. */
    static final class LiveMarker {
        final long pid;
        final String name;
        final String json;

        private LiveMarker(long pid, String name, String json) {
            this.pid = pid;
            this.name = name;
            this.json = json;
        }
    }

    /**
     * The {@code <prefix><pid>.json} markers in the state dir whose process is alive, sorted by
     * name, with their text; markers of dead pids, bad names or gone meanwhile are left out.
     */
    static List<LiveMarker> liveMarkers(Path stateDir, String prefix) {
        List<Path> paths = new ArrayList<>();
        try (DirectoryStream<Path> files = Files.newDirectoryStream(stateDir, prefix + "*.json")) {
            files.forEach(paths::add);
        } catch (IOException e) { // no state dir yet: no marker
            return Collections.emptyList();
        }
        Collections.sort(paths);
        List<LiveMarker> live = new ArrayList<>();
        for (Path path : paths) {
            String name = path.getFileName().toString();
            long pid;
            try {
                pid = Long.parseLong(name.substring(prefix.length(), name.length() - ".json".length()));
            } catch (NumberFormatException e) {
                continue;
            }
            if (!ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)) {
                continue; // left behind by a worker that was killed: it no longer answers anything
            }
            try {
                live.add(new LiveMarker(pid, name, new String(Files.readAllBytes(path), StandardCharsets.UTF_8)));
            } catch (IOException e) {
                // removed meanwhile: the worker exited to be restarted, or its replicas serve again
            }
        }
        return live;
    }

    private static String truncated(String cause) {
        return cause.length() > MAX_CAUSE_CHARS ? cause.substring(0, MAX_CAUSE_CHARS) + "..." : cause;
    }

    /**
     * The string value of {@code key} in a small JSON object such as {@code {"cause": "..."}}, with
     * its escapes decoded; null when absent or malformed. Enough for the marker the worker writes
     * (json.dumps of one key), not a general JSON parser.
     */
    static String stringField(String json, String key) {
        int i = json.indexOf('"' + key + '"');
        if (i < 0) {
            return null;
        }
        i = skipSpace(json, i + key.length() + 2);
        if (i >= json.length() || json.charAt(i) != ':') {
            return null;
        }
        i = skipSpace(json, i + 1);
        if (i >= json.length() || json.charAt(i) != '"') {
            return null;
        }
        StringBuilder out = new StringBuilder();
        for (i = i + 1; i < json.length(); i++) {
            char c = json.charAt(i);
            if (c == '"') {
                return out.toString();
            }
            if (c != '\\') {
                out.append(c);
                continue;
            }
            if (++i >= json.length()) {
                return null;
            }
            char e = json.charAt(i);
            switch (e) {
                case '"':
                case '\\':
                case '/':
                    out.append(e);
                    break;
                case 'b':
                    out.append('\b');
                    break;
                case 'f':
                    out.append('\f');
                    break;
                case 'n':
                    out.append('\n');
                    break;
                case 'r':
                    out.append('\r');
                    break;
                case 't':
                    out.append('\t');
                    break;
                case 'u':
                    if (i + 4 >= json.length()) {
                        return null;
                    }
                    try {
                        out.append((char) Integer.parseInt(json.substring(i + 1, i + 5), 16));
                    } catch (NumberFormatException ex) {
                        return null;
                    }
                    i += 4;
                    break;
                default:
                    return null;
            }
        }
        return null; // unterminated string
    }

    private static int skipSpace(String s, int i) {
        while (i < s.length() && Character.isWhitespace(s.charAt(i))) {
            i++;
        }
        return i;
    }

    /**
     * {@code s} as a JSON string literal in plain ASCII: quote, backslash and control characters
     * escaped, everything outside printable ASCII as {@code \\uXXXX} (UTF-16 units, so surrogate
     * pairs stay pairs and a lone surrogate cannot turn into invalid UTF-8).
     */
    static String quote(String s) {
        StringBuilder out = new StringBuilder(s.length() + 16).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"':
                    out.append("\\\"");
                    break;
                case '\\':
                    out.append("\\\\");
                    break;
                case '\n':
                    out.append("\\n");
                    break;
                case '\r':
                    out.append("\\r");
                    break;
                case '\t':
                    out.append("\\t");
                    break;
                default:
                    if (c < 0x20 || c > 0x7e) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        return out.append('"').toString();
    }

    static final class Verdict {
        static final Verdict HEALTHY = new Verdict(200, "Healthy", null);

        final int code;
        final String status;
        final String message;

        private Verdict(int code, String status, String message) {
            this.code = code;
            this.status = status;
            this.message = message;
        }

        static Verdict unready(String status, String message) {
            return new Verdict(503, status, message);
        }

        static Verdict degraded(String message) {
            return new Verdict(200, "Degraded", message);
        }

        String json() {
            String body = "{\"status\": " + quote(status);
            if (message != null) {
                body += ", \"message\": " + quote(message);
            }
            return body + "}\n";
        }
    }
}
