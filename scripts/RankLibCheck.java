// Cross-checks the RankLib fixture's expected scores (written by make_import_fixtures.py's
// Python evaluator) with Java's own float arithmetic: the model is read the way RankLib's
// LambdaMART.loadFromString and Ensemble(String) read it (lines trimmed, `##` lines dropped,
// the JDK's DOM parser, children by position, Float.parseFloat) and scored as Split.eval and
// Ensemble.eval do (`value <= threshold` in float, NaN read as 0, `float s += output * weight`).
// This is code written from that reading, not RankLib's; RankLib itself was not reachable.
//
// Run:  cd scripts && java RankLibCheck.java ../fixtures/trees/ranklib_lambdamart.{model.xml,rows.csv,expected.txt}
import java.io.*;
import java.nio.file.*;
import java.util.*;
import javax.xml.parsers.*;
import org.w3c.dom.*;

public class RankLibCheck {
    static final class N { int fid = -1; float thr; double out; N l, r; }
    static N create(Node n) {
        N s = new N();
        if (n.getFirstChild().getNodeName().equalsIgnoreCase("feature")) {
            NodeList nl = n.getChildNodes();
            s.fid = Integer.parseInt(nl.item(0).getFirstChild().getNodeValue().trim());
            s.thr = Float.parseFloat(nl.item(1).getFirstChild().getNodeValue().trim());
            s.l = create(nl.item(2)); s.r = create(nl.item(3));
        } else {
            s.out = Float.parseFloat(n.getFirstChild().getFirstChild().getNodeValue().trim());
        }
        return s;
    }
    public static void main(String[] a) throws Exception {
        StringBuilder model = new StringBuilder();
        for (String line : Files.readAllLines(Paths.get(a[0]))) {
            line = line.trim();
            if (line.isEmpty() || line.startsWith("##")) continue;
            model.append(line);
        }
        Document doc = DocumentBuilderFactory.newInstance().newDocumentBuilder()
            .parse(new ByteArrayInputStream(model.toString().getBytes("UTF-8")));
        NodeList trees = doc.getElementsByTagName("tree");
        List<N> roots = new ArrayList<>(); List<Float> ws = new ArrayList<>();
        for (int i = 0; i < trees.getLength(); i++) {
            roots.add(create(trees.item(i).getFirstChild()));
            ws.add(Float.parseFloat(trees.item(i).getAttributes().getNamedItem("weight").getNodeValue()));
        }
        List<String> expected = Files.readAllLines(Paths.get(a[2]));
        int row = 0, mismatches = 0;
        for (String line : Files.readAllLines(Paths.get(a[1]))) {
            String[] f = line.split(",", -1);
            float[] v = new float[f.length + 1];
            for (int i = 0; i < f.length; i++) v[i + 1] = f[i].isEmpty() ? Float.NaN : (float) Double.parseDouble(f[i]);
            float s = 0;
            for (int t = 0; t < roots.size(); t++) {
                N n = roots.get(t);
                while (n.fid != -1) {
                    float x = Float.isNaN(v[n.fid]) ? 0 : v[n.fid];
                    n = x <= n.thr ? n.l : n.r;
                }
                s += n.out * ws.get(t);
            }
            double want = Double.parseDouble(expected.get(row));
            if ((double) s != want) { mismatches++; System.out.println("row " + row + ": java " + (double) s + " python " + want); }
            row++;
        }
        System.out.println(row + " rows, " + mismatches + " differ");
        if (mismatches > 0) System.exit(1);
    }
}
