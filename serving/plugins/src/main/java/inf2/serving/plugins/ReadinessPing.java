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
 * and every registered model has a worker whose initialize() returned (TorchServe's
 * WORKER_MODEL_LOADED). Otherwise 503 {@code {"status": "Draining"|"Unhealthy"|"Loading",
 * "message": ...}}. Draining and failed starts come from the state directory named by
 * INF2_STATE_DIR (handler/serving/state.py): {@code drain.json}, and {@code failed-<pid>.json}
 * {@code {"cause": ...}} while that worker process is alive. Dependency-free: the JSON in and out
 * is handled here.
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
        List<Path> markers = new ArrayList<>();
        try (DirectoryStream<Path> files = Files.newDirectoryStream(stateDir, "failed-*.json")) {
            files.forEach(markers::add);
        } catch (IOException e) { // no state dir yet: nothing failed
            return null;
        }
        Collections.sort(markers);
        for (Path marker : markers) {
            String name = marker.getFileName().toString();
            long pid;
            try {
                pid = Long.parseLong(name.substring("failed-".length(), name.length() - ".json".length()));
            } catch (NumberFormatException e) {
                continue;
            }
            if (!ProcessHandle.of(pid).map(ProcessHandle::isAlive).orElse(false)) {
                continue; // left behind by a worker that was killed: it no longer answers anything
            }
            String cause;
            try {
                cause = stringField(new String(Files.readAllBytes(marker), StandardCharsets.UTF_8), "cause");
            } catch (IOException e) { // removed meanwhile: the worker exited to be restarted
                continue;
            }
            if (cause == null) {
                cause = "(" + name + " holds no readable cause)";
            }
            if (cause.length() > MAX_CAUSE_CHARS) {
                cause = cause.substring(0, MAX_CAUSE_CHARS) + "...";
            }
            return "worker " + pid + " failed to initialize: " + cause;
        }
        return null;
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

        String json() {
            String body = "{\"status\": " + quote(status);
            if (message != null) {
                body += ", \"message\": " + quote(message);
            }
            return body + "}\n";
        }
    }
}
